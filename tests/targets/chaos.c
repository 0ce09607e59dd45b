/* A fixed workload for the chaos test: work(i) N times (default 6000), a short sleep between
 * calls, then the count and a checksum on stdout and exit 0 — so a run disturbed by whatever
 * happened to the tracer shows as a different output or status. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) long work(long i)
{
    return i * 7 + (i >> 3);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 6000;
    struct timespec pause = {0, 200000};
    long sum = 0;
    for (long i = 0; i < n; i++) {
        sum += work(i);
        nanosleep(&pause, NULL);
    }
    printf("calls %ld sum %ld\n", n, sum);
    return 0;
}
