/* Threads calling a probed function; each thread passes its own id. */
#include <pthread.h>
#include <stdio.h>

#define THREADS 4
#define CALLS 25

__attribute__((noinline)) long work(long id, long i)
{
    return id * 1000 + i;
}

static void *run(void *arg)
{
    long id = (long)arg, sum = 0;
    for (long i = 0; i < CALLS; i++)
        sum += work(id, i);
    return (void *)sum;
}

int main(void)
{
    pthread_t t[THREADS];
    long total = 0;
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, run, (void *)(i + 1));
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        total += (long)r;
    }
    printf("total=%ld\n", total);
    return 0;
}
