/* Signals around probes: handlers that call probed code, the program's own SIGTRAPs (raise and
 * an int3 instruction), a fault in a probed instruction caught by a SIGSEGV handler (which must
 * see the original instruction's address), and a child that stops itself until continued. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

static volatile int usr1, traps;
static sigjmp_buf recover;
static volatile unsigned long fault_ip;

__attribute__((noinline)) int work(int x)
{
    return x + 1;
}

long load_from(long *p);
extern char site_fault[];
__asm__(".text\n.globl load_from\n.type load_from,@function\nload_from:\n"
        ".globl site_fault\nsite_fault:\n"
        "  mov (%rdi), %rax\n"
        "  ret\n");

static void on_usr1(int sig)
{
    usr1 += work(sig);
}

static void on_trap(int sig)
{
    traps++;
}

static void on_segv(int sig, siginfo_t *info, void *context)
{
    ucontext_t *uc = context;
    fault_ip = uc->uc_mcontext.gregs[REG_RIP];
    siglongjmp(recover, 1);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    signal(SIGUSR1, on_usr1);
    signal(SIGTRAP, on_trap);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);

    for (int i = 0; i < 5; i++) {
        work(i);
        kill(getpid(), SIGUSR1);
    }
    printf("usr1 total=%d\n", usr1);

    raise(SIGTRAP);
    __asm__ volatile("int3");
    printf("own traps=%d\n", traps);

    long value = 42;
    printf("load=%ld\n", load_from(&value));
    if (sigsetjmp(recover, 1) == 0)
        load_from(NULL);
    printf("fault at site: %s\n", fault_ip == (unsigned long)site_fault ? "yes" : "no");

    pid_t child = fork();
    if (child == 0) {
        raise(SIGSTOP);
        printf("child continued, work=%d\n", work(100));
        _exit(7);
    }
    int status;
    waitpid(child, &status, WUNTRACED);
    printf("child stopped: %s\n", WIFSTOPPED(status) ? "yes" : "no");
    kill(child, SIGCONT);
    waitpid(child, &status, 0);
    printf("child exit=%d\n", WEXITSTATUS(status));
    return 0;
}
