/* Known kernel activity for tracepoint tests: getpid, a 2 ms nanosleep, and a 13-byte write
 * to the file named by argv[1]; prints its pid so the test can check the recorded fields. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    struct timespec pause = {0, 2000000};
    long pid = syscall(SYS_getpid);
    syscall(SYS_nanosleep, &pause, NULL);
    int fd = open(argc > 1 ? argv[1] : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    long written = syscall(SYS_write, fd, "probescope!!\n", 13);
    close(fd);
    printf("pid %ld fd %d wrote %ld\n", pid, fd, written);
    return 0;
}
