/* Calls work(i) as fast as it can, N times (default: until SIGTERM/SIGINT); prints the count
 * and a checksum when it ends, so tests can check a traced program ran undisturbed. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static volatile sig_atomic_t stop;

__attribute__((noinline)) long work(long i)
{
    return i * 3 + 1;
}

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv)
{
    long limit = argc > 1 ? atol(argv[1]) : -1;
    long calls = 0, sum = 0;
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    for (long i = 0; !stop && (limit < 0 || i < limit); i++) {
        sum += work(i);
        calls++;
    }
    printf("calls %ld sum %ld\n", calls, sum);
    fflush(stdout);
    return 0;
}
