/* Recursion 5,000 frames deep (argv[1] overrides the depth), twice, with a leaf call at the
 * bottom and a call on the way back up. */
#include <stdio.h>
#include <stdlib.h>
#define NI __attribute__((noinline))
static volatile long sink;
NI void bottom(long n) { sink += n; }
NI void unwind_step(long n) { sink ^= n; }
NI long descend(long n) {
	if (n == 0) { bottom(n); return 0; }
	long r = descend(n - 1) + 1;
	if (n % 1000 == 0) unwind_step(n);
	return r;
}
int main(int argc, char **argv) {
	long depth = argc > 1 ? strtol(argv[1], NULL, 10) : 5000;
	long a = descend(depth);
	long b = descend(depth / 2);
	printf("%ld %ld\n", a, b);
	return 0;
}
