/* Two functions that call each other (is_odd sits right after is_even in memory, so the call
 * to it lands a few bytes after the call instruction) and a self-recursive one. */
#include <stdio.h>
#define NI __attribute__((noinline))
NI int is_odd(int n);
NI int is_even(int n) { if (n == 0) return 1; int r = is_odd(n - 1); __asm__ volatile(""); return r; }
NI int is_odd(int n) { if (n == 0) return 0; int r = is_even(n - 1); __asm__ volatile(""); return r; }
NI int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int main(int c, char **v) { (void)v; printf("%d %d\n", is_even(5 + c), fib(5)); return 0; }
