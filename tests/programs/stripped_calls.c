/* Calls between functions that a stripped binary has no names for: ptscope names each
 * call after the address it lands at (tests/emulated/test_stripped_names.py counts them:
 * outer 5, middle 10, leaf 30). */
#include <stdio.h>

__attribute__((noinline, noclone)) int leaf(int x)
{
	return x * 3 + 1;
}

__attribute__((noinline, noclone)) int middle(int x)
{
	int sum = 0;
	for (int i = 0; i < 3; i++)
		sum += leaf(x + i);
	return sum;
}

__attribute__((noinline, noclone)) int outer(int x)
{
	return middle(x) + middle(x + 1) * 2;
}

int main(void)
{
	int sum = 0;
	for (int i = 0; i < 5; i++)
		sum += outer(i);
	printf("%d\n", sum);
	return 0;
}
