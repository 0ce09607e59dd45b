/* Calls tick(i) every few milliseconds, forever or N times; prints its count when it ends
 * (normally or by SIGTERM/SIGINT), so tests can check the program was never disturbed. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static volatile long ticks;

__attribute__((noinline)) long tick(long i)
{
    ticks += 1;
    return i;
}

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv)
{
    long limit = argc > 1 ? atol(argv[1]) : -1;
    int delay_us = argc > 2 ? atoi(argv[2]) : 2000;
    struct timespec pause = {0, delay_us * 1000L};
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    for (long i = 0; !stop && (limit < 0 || i < limit); i++) {
        tick(i);
        nanosleep(&pause, NULL);
    }
    printf("ticks %ld\n", ticks);
    fflush(stdout);
    return 0;
}
