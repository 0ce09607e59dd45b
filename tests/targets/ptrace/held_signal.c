/* A loop calling a probed function; SIGUSR1's handler says so on stdout and stays in the
 * handler until a line arrives on stdin, so a tracer can detach while the signal frame on the
 * stack holds the pc the signal interrupted (an XOL slot when it came during a hit). Then the
 * loop ends and the program prints how many calls returned the right value. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t released;

__attribute__((noinline)) long work(long x)
{
    return x * 3 + 1;
}

static void held(int signum)
{
    (void)signum;
    static const char message[] = "in handler\n";
    char line[64];
    if (write(STDOUT_FILENO, message, strlen(message)) < 0)
        _exit(4);
    if (read(STDIN_FILENO, line, sizeof line) <= 0)
        _exit(3);
    released = 1;
}

int main(void)
{
    struct sigaction action = {.sa_handler = held, .sa_flags = SA_RESTART};
    sigaction(SIGUSR1, &action, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("running\n");
    long calls = 0, good = 0;
    while (!released) {
        good += work(calls) == calls * 3 + 1;
        calls++;
    }
    printf("correct %s\n", good == calls ? "yes" : "no");
    return good == calls ? 0 : 1;
}
