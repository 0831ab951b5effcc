/* Two threads besides main, each calling its own functions. */
#include <pthread.h>
#include <stdio.h>

__attribute__((noinline)) static long work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += i ^ (s >> 3);
    return s;
}
__attribute__((noinline)) static void *left(void *arg) { return (void *)work((long)arg); }
__attribute__((noinline)) static void *right(void *arg) { return (void *)(work((long)arg) + 1); }

int main(void) {
    pthread_t a, b;
    void *ra, *rb;
    pthread_create(&a, NULL, left, (void *)2000L);
    pthread_create(&b, NULL, right, (void *)3000L);
    long m = work(1000);
    pthread_join(a, &ra);
    pthread_join(b, &rb);
    printf("threads %ld\n", (long)ra + (long)rb + m > 0);
    return 0;
}
