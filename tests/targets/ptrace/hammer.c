/* Threads calling probed functions as fast as they can until a line arrives on stdin, then a
 * checksum that any corrupted call, return or register would change; then the program waits
 * for a second line before it exits, so that its text can be compared with the file.
 * usage: hammer [THREADS] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_THREADS 16

static volatile int stop;

__attribute__((noinline)) long mix(long a, long b)
{
    return (a * 31 + b) % 1000003;
}

__attribute__((noinline)) long layer(long a, long b)
{
    return mix(a, b) + mix(b, a);
}

static void *run(void *arg)
{
    long id = (long)arg, sum = 0, calls = 0;
    while (!stop) {
        for (int i = 0; i < 100; i++, calls++)
            sum = (sum + layer(id + calls, calls)) % 1000003;
    }
    long check = 0;
    for (long c = 0; c < calls; c++)
        check = (check + ((id + c) * 31 + c) % 1000003 + (c * 31 + id + c) % 1000003) % 1000003;
    return (void *)(long)(sum == check);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    if (threads < 1 || threads > MAX_THREADS)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    pthread_t t[MAX_THREADS];
    for (long i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, run, (void *)i);
    printf("running\n");
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return 3;
    stop = 1;
    int good = 0;
    for (int i = 0; i < threads; i++) {
        void *r;
        pthread_join(t[i], &r);
        good += (long)r;
    }
    printf("threads with a correct checksum: %d of %d\n", good, threads);
    if (!fgets(line, sizeof line, stdin))
        return 3;
    return good == threads ? 0 : 1;
}
