/* Threads created and joined continuously for about two seconds, each calling a probed function:
 * attaching and detaching must catch threads being born and dying. */
#include <pthread.h>
#include <stdio.h>
#include <time.h>

__attribute__((noinline)) long born(long n)
{
    return n * 2;
}

static void *run(void *arg)
{
    return (void *)born((long)arg);
}

int main(void)
{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long created = 0, sum = 0;
    do {
        pthread_t t[4];
        for (long i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, run, (void *)(created + i));
        for (int i = 0; i < 4; i++) {
            void *r;
            pthread_join(t[i], &r);
            sum += (long)r;
        }
        created += 4;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (now.tv_sec - start.tv_sec < 2);
    printf("%s\n", sum == created * (created - 1) ? "sum ok" : "sum WRONG");
    return 0;
}
