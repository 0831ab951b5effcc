/* Asynchronous preemption the way Go does it: a signal interrupts the main thread, whose
 * handler rewrites the saved RIP so that, when the handler returns, the thread "calls"
 * preempt_stub, which saves the registers, runs preempted() and returns to where the
 * thread was interrupted. Go's sysmon thread sends SIGURG once the last preemption ran;
 * here preempted() arms a one-shot timer (SIGALRM 100 us later), which bounds the work
 * between two preemptions whatever the host's load (a second thread sending them waited
 * for a core on a busy host while this one ran on, and the trace grew a hundredfold).
 * Every interrupted RIP is logged by the handler (the program's own truth) and written to
 * argv[2] at the end. argv[1]: how many preemptions. Built with -mno-red-zone (the stub's
 * return address goes below RSP). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <ucontext.h>

#define MAX 20000
static volatile int preemptions;
static unsigned long interrupted[MAX];
static volatile int wanted = 3000;

void preempt_stub(void);
static void arm(void) {
    struct itimerval once = {{0, 0}, {0, 100}};
    setitimer(ITIMER_REAL, &once, NULL);
}

/* The next preemption is armed once this one has run: no signal comes while the handler
 * or the stub runs (as with Go's sysmon, which waits for the last one). */
__attribute__((noinline, used)) void preempted(void) {
    preemptions = preemptions + 1;
    if (preemptions < wanted) arm();
}

__asm__(".text\n"
        ".globl preempt_stub\n"
        ".type preempt_stub,@function\n"
        "preempt_stub:\n"
        "  pushfq\n"
        "  push %rax\n  push %rcx\n  push %rdx\n  push %rsi\n  push %rdi\n"
        "  push %r8\n  push %r9\n  push %r10\n  push %r11\n  push %rbp\n"
        "  mov %rsp, %rbp\n"
        "  and $-16, %rsp\n"
        "  call preempted\n"
        "  mov %rbp, %rsp\n"
        "  pop %rbp\n  pop %r11\n  pop %r10\n  pop %r9\n  pop %r8\n"
        "  pop %rdi\n  pop %rsi\n  pop %rdx\n  pop %rcx\n  pop %rax\n"
        "  popfq\n"
        "  ret\n"
        ".size preempt_stub, .-preempt_stub\n");

static int seen;

static void on_urg(int sig, siginfo_t *si, void *ctx) {
    (void)sig, (void)si;
    greg_t *g = ((ucontext_t *)ctx)->uc_mcontext.gregs;
    if (seen < MAX) interrupted[seen++] = (unsigned long)g[REG_RIP];
    g[REG_RSP] -= 8;  /* a call to preempt_stub from the interrupted instruction */
    *(greg_t *)g[REG_RSP] = g[REG_RIP];
    g[REG_RIP] = (greg_t)preempt_stub;
}

/* Many conditional branches: the signal often lands right after one. */
__attribute__((noinline)) static long work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        if ((i ^ s) & 1) s += i; else s -= 3;
        if (s & 4) s ^= 5;
    }
    return s;
}

int main(int argc, char **argv) {
    if (argc > 1) wanted = atoi(argv[1]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_urg;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    arm();
    long s = 0;
    while (preemptions < wanted) s += work(100);
    FILE *out = argc > 2 ? fopen(argv[2], "w") : stdout;
    for (int i = 0; i < seen; i++) fprintf(out, "%lx\n", interrupted[i]);
    if (out != stdout) fclose(out);
    printf("preemptions %d %ld\n", preemptions, s != 0);
    return 0;
}
