/* Signal handlers that leave by siglongjmp (issue 21, item 1). Each call is logged with its
 * depth so a test can check the trace's nesting against the program's own account.
 *
 * alarm: f(3) arms sigsetjmp, the recursion goes on to f(0), which waits in pause(); the
 *        SIGALRM handler siglongjmps back to f(3). The handler ran on top of pause() in
 *        f(0); f(2)..f(0) end at the jump, after the handler started.
 * segv:  the same shape with a SIGSEGV handler on a sigaltstack: f(0) calls through a null
 *        pointer slot, the handler recovers by siglongjmp (the usual fault-recovery
 *        pattern). The faulting instruction is an indirect call, the last of its block: QEMU's
 *        log, the tests' ground truth, cannot tell how far a block ran before a fault. */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#define NI __attribute__((noinline, noclone))

static sigjmp_buf env;
static int use_segv;
static volatile long sink;
static void (**volatile null_slot)(void);

NI static void on_alarm(int sig) { sink += sig; siglongjmp(env, 1); }
NI static void on_segv(int sig) { sink += sig; siglongjmp(env, 2); }

NI static long resumed(long v) { return v * 3 + sink; }

NI static void wait_here(void)
{
	if (use_segv) {
		(*null_slot)(); /* faults reading the slot */
		sink++;
	} else {
		struct itimerval t = {{0, 0}, {0, 2000}};
		setitimer(ITIMER_REAL, &t, 0);
		for (;;)
			pause();
	}
}

NI static long f(long n)
{
	if (n == 3) {
		int v = sigsetjmp(env, 1);
		if (v)
			return resumed(v);
	}
	if (n == 0) {
		wait_here();
		return 0;
	}
	return f(n - 1) + 1;
}

int main(int argc, char **argv)
{
	use_segv = argc > 1 && strcmp(argv[1], "segv") == 0;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	if (use_segv) {
		static char altstack[65536];
		stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack};
		sigaltstack(&ss, 0);
		sa.sa_handler = on_segv;
		sa.sa_flags = SA_ONSTACK;
		sigaction(SIGSEGV, &sa, 0);
	} else {
		sa.sa_handler = on_alarm;
		sigaction(SIGALRM, &sa, 0);
	}
	long r = f(5);
	printf("siglongjmp %ld\n", r);
	return 0;
}
