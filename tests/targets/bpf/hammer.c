/* THREADS threads each call hit(thread, i) CALLS times as fast as they can, thread t pinned to
 * the (t mod N)-th CPU the process may use (the scheduler alone may keep them all on one): records
 * from every CPU reach the BPF ring buffer interleaved, and their reservation order is not their
 * time order. Prints the calls made. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

static long calls;

__attribute__((noinline)) long hit(long thread, long i)
{
    __asm__ volatile("" ::: "memory");
    return thread + i;
}

static cpu_set_t allowed;

static void pin(long thread)
{
    int count = CPU_COUNT(&allowed), seen = 0;
    for (int cpu = 0; count > 0 && cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &allowed))
            continue;
        if (seen++ == thread % count) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            sched_setaffinity(0, sizeof(one), &one);
            return;
        }
    }
}

static void *run(void *arg)
{
    long thread = (long)arg, sum = 0;
    pin(thread);
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
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        CPU_ZERO(&allowed);
    for (long t = 0; t < threads; t++)
        pthread_create(&handles[t], NULL, run, (void *)t);
    for (int t = 0; t < threads; t++)
        pthread_join(handles[t], NULL);
    printf("calls=%ld\n", threads * calls);
    return 0;
}
