/* A longjmp to an older activation in recursion (issue 21, item 2): f(9), f(6) and f(3)
 * each arm a jmp_buf at the same setjmp call site; f(0) jumps to f(9)'s. `resumed` is f(9)'s
 * child and f(8)..f(0) end at the longjmp. With an argument N, f(0) jumps to f(N)'s buffer
 * instead (N in 9, 6, 3). */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

#define NI __attribute__((noinline, noclone))

static jmp_buf *target;
static long jump_to = 9;
static volatile long sink;

NI static long resumed(long v) { return v * 3 + sink; }

NI static long f(long n)
{
	jmp_buf here;
	if (n == 9 || n == 6 || n == 3) {
		if (setjmp(here))
			return resumed(n);
		if (n == jump_to)
			target = &here;
	}
	if (n == 0)
		longjmp(*target, 1);
	return f(n - 1) + 1;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		jump_to = atol(argv[1]);
	long r = f(9);
	printf("longjmp_older %ld\n", r);
	return 0;
}
