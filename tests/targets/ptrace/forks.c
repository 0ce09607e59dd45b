/* fork and vfork: children inherit the probed text (and any int3 in it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) int work(int who, int i)
{
    return who * 100 + i;
}

int main(int argc, char **argv)
{
    int sum = 0, status = 0;
    setvbuf(stdout, NULL, _IONBF, 0);
    for (int i = 0; i < 2; i++)
        sum += work(1, i);
    pid_t child = fork();
    if (child == 0) {
        int s = 0;
        for (int i = 0; i < 3; i++)
            s += work(2, i);
        printf("child sum=%d\n", s);
        _exit(s % 256);
    }
    waitpid(child, &status, 0);
    printf("child exit=%d\n", WEXITSTATUS(status));
    pid_t v = vfork();
    if (v == 0) {
        execl("/bin/echo", "echo", "vfork child ran", (char *)NULL);
        _exit(127);
    }
    waitpid(v, &status, 0);
    for (int i = 0; i < 2; i++)
        sum += work(3, i);
    printf("parent sum=%d\n", sum);
    return 0;
}
