/* 100,000 calls (argv[1] rounds of 10 calls each, default 10,000): a loop calling a small
 * tree of functions, each of which writes a volatile so nothing is hoisted. */
#include <stdio.h>
#include <stdlib.h>
#define NI __attribute__((noinline))
static volatile long sink;
NI void leaf_a(long i) { sink += i; }
NI void leaf_b(long i) { sink ^= i; }
NI void pair(long i) { leaf_a(i); leaf_b(i); }
NI void step(long i) { pair(i); pair(i + 1); leaf_a(i); leaf_b(i); pair(i + 2); }
int main(int argc, char **argv) {
	long rounds = argc > 1 ? strtol(argv[1], NULL, 10) : 10000;
	for (long i = 0; i < rounds; i++) step(i);
	printf("%ld\n", (long)sink);
	return 0;
}
