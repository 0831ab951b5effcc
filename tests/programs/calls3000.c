/* main calls leaf() 3,000 times: the calls a decode must all find. */
#include <stdio.h>

__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }

int main(void) {
    int s = 0;
    for (int i = 0; i < 3000; i++) s += leaf(i);
    printf("%d\n", s);
    return 0;
}
