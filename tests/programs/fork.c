/* fork: the child does some work and exits; the parent waits and goes on. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) static int child_work(int n) { int s = 0; for (int i = 0; i < n; i++) s += i; return s; }
__attribute__((noinline)) static int parent_work(int n) { int s = 1; for (int i = 0; i < n; i++) s ^= i * 3; return s; }

int main(void) {
    pid_t pid = fork();
    if (pid == 0) _exit(child_work(500) & 0x7f);
    int status = 0;
    int p = parent_work(300);
    waitpid(pid, &status, 0);
    printf("fork %d %d\n", WEXITSTATUS(status), p + parent_work(100));
    return 0;
}
