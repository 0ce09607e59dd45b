/* A program under a seccomp filter (one that allows everything): the fentry engine must refuse
 * to touch it. Runs until its stdin closes. */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <sys/prctl.h>

__attribute__((noinline)) int work(int x)
{
    return x + 1;
}

int main(void)
{
    struct sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    struct sock_fprog program = {1, allow};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program)) {
        perror("seccomp");
        return 2;
    }
    int sum = 0;
    while (getchar() != EOF)
        sum += work(sum);
    printf("%d\n", sum);
    return 0;
}
