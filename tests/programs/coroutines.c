/* Coroutines on their own stacks (swapcontext): a scheduler resumes two coroutines in turn,
 * and coroutine 0 also switches straight to coroutine 1 (a symmetric switch). Both suspend
 * in the same function at the same call site, so only what ran tells them apart. */
#include <stdio.h>
#include <ucontext.h>
#define NI __attribute__((noinline))
#define STACK (64 * 1024)
static ucontext_t scheduler, coroutine[2];
static char stacks[2][STACK] __attribute__((aligned(16)));
static int finished[2];
static volatile long sink;

NI void leaf(long v) { sink += v; }
NI void suspend(int id, ucontext_t *to) { swapcontext(&coroutine[id], to); }
NI void work(int id, int depth, int round) {
	if (depth > 0) {
		work(id, depth - 1, round);
		leaf(depth);
		return;
	}
	/* Coroutine 0 hands over to coroutine 1 directly in round 1. */
	suspend(id, id == 0 && round == 1 && !finished[1] ? &coroutine[1] : &scheduler);
	leaf(id);
}
NI void body(int id) {
	for (int round = 0; round < 3; round++) work(id, 2 + id, round);
	finished[id] = 1;
}
NI void run_all(void) {
	while (!finished[0] || !finished[1])
		for (int i = 0; i < 2; i++)
			if (!finished[i]) swapcontext(&scheduler, &coroutine[i]);
}
int main(void) {
	for (int i = 0; i < 2; i++) {
		getcontext(&coroutine[i]);
		coroutine[i].uc_stack.ss_sp = stacks[i];
		coroutine[i].uc_stack.ss_size = STACK;
		coroutine[i].uc_link = &scheduler;
		makecontext(&coroutine[i], (void (*)(void))body, 1, i);
	}
	run_all();
	printf("%ld\n", (long)sink);
	return 0;
}
