/* A library that dlopen.c loads at run time. */
__attribute__((noinline)) static int inner(int x) { return x * 5 + 2; }
int plugin_entry(int x) { return inner(x) + inner(x + 1); }
