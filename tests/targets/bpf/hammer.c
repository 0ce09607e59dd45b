/* THREADS threads each call hit(thread, i) CALLS times as fast as they can, spread over the
 * CPUs: records from every CPU reach the BPF ring buffer interleaved, and their reservation
 * order is not their time order. Prints the calls made. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static long calls;

__attribute__((noinline)) long hit(long thread, long i)
{
    __asm__ volatile("" ::: "memory");
    return thread + i;
}

static void *run(void *arg)
{
    long thread = (long)arg, sum = 0;
    for (long i = 0; i < calls; i++)
        sum += hit(thread, i);
    return (void *)sum;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    pthread_t handles[64];
    calls = argc > 2 ? atol(argv[2]) : 100000;
    if (threads < 1 || threads > 64)
        return 2;
    for (long t = 0; t < threads; t++)
        pthread_create(&handles[t], NULL, run, (void *)t);
    for (int t = 0; t < threads; t++)
        pthread_join(handles[t], NULL);
    printf("calls=%ld\n", threads * calls);
    return 0;
}
