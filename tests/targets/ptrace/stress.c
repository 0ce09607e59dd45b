/* Four threads calling a probed function (entry and return probes) as fast as they can for
 * about two seconds, then a checksum that any corrupted return or register would change. */
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#define THREADS 4

__attribute__((noinline)) long mix(long a, long b)
{
    return (a * 31 + b) % 1000003;
}

__attribute__((noinline)) long layer(long a, long b)
{
    return mix(a, b) + mix(b, a);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *run(void *arg)
{
    long id = (long)arg, sum = 0, calls = 0;
    double end = now() + 2.0;
    while (now() < end) {
        for (int i = 0; i < 100; i++, calls++)
            sum = (sum + layer(id + calls, calls)) % 1000003;
    }
    long check = 0;
    for (long c = 0; c < calls; c++)
        check = (check + ((id + c) * 31 + c) % 1000003 + (c * 31 + id + c) % 1000003) % 1000003;
    return (void *)(long)(sum == check);
}

int main(void)
{
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, run, (void *)i);
    int good = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        good += (long)r;
    }
    printf("threads with a correct checksum: %d of %d\n", good, THREADS);
    return good == THREADS ? 0 : 1;
}
