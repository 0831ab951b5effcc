/* Four threads that each recurse (mutual recursion of different depths) while main
 * recurses too; each thread's frames must stay on its own track. */
#include <pthread.h>
#include <stdio.h>
#define NI __attribute__((noinline))
static volatile long sink;
NI long ping(long n);
NI long pong(long n) { if (n <= 0) { sink++; return 0; } return ping(n - 1) + 1; }
NI long ping(long n) { if (n <= 0) { sink--; return 0; } long r = pong(n - 1); sink += r; return r + 1; }
NI long tree(long n) { if (n <= 1) return 1; return tree(n - 1) + tree(n - 2); }
NI void *worker(void *arg) {
	long id = (long)arg;
	long r = 0;
	for (int i = 0; i < 3; i++) r += ping(10 + 7 * id) + tree(4 + id);
	return (void *)r;
}
int main(void) {
	pthread_t t[4];
	for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)i);
	long total = tree(6) + ping(20);
	for (int i = 0; i < 4; i++) {
		void *r;
		pthread_join(t[i], &r);
		total += (long)r;
	}
	printf("%ld\n", total);
	return 0;
}
