/* Inlined calls end to end (tests/decode/test_inlined_frames.py): always_inline and static
 * inline functions, nested three deep, one inlined at several call sites, inlined bodies
 * that call real functions (which nest under them) and bodies inlined into those, a
 * function whose return is inside an inlined body, and a loop that enters and leaves
 * inlined bodies without a branch. Built at -O2 with -g (and, for the hooks' oracle, with
 * -finstrument-functions: gcc calls the hooks around inlined bodies too). */
#include <stdio.h>
#include <stdlib.h>

#define ALWAYS static inline __attribute__((always_inline))
#define NOINLINE __attribute__((noinline))

static volatile int sink;

NOINLINE int leaf(int x) { return sink = x * 3 + 1; }

ALWAYS int square(int x) { return x * x; }

ALWAYS int sum_squares(int a, int b) { return square(a) + square(b); }

ALWAYS int with_call(int x)
{
	int y = leaf(x);          /* a real call from inside an inlined body */
	return sum_squares(y, x); /* then two more bodies, nested */
}

NOINLINE int middle(int x) { return with_call(x) + square(x); }

ALWAYS int tail_inline(int x) { return middle(x + 1) ^ x; }

NOINLINE int returns_inside(int x) { return tail_inline(x); }

NOINLINE int loop(int n)
{
	int acc = 0;
	for (int i = 0; i < n; i++) {
		acc += with_call(i);
		acc ^= sum_squares(acc & 7, i);
		if (acc & 1)
			acc += middle(i);
	}
	return acc;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 20;
	printf("%d %d\n", loop(n), returns_inside(n));
	return 0;
}
