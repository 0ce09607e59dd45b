/* Four threads each call work() a known number of times with their index. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) int work(int thread, int i) { return thread * 1000 + i; }

static void *run(void *arg)
{
    long id = (long)arg;
    long sum = 0;
    for (int i = 0; i < 25; i++)
        sum += work((int)id, i);
    return (void *)sum;
}

int main(void)
{
    pthread_t threads[4];
    long total = 0;
    for (long t = 0; t < 4; t++)
        pthread_create(&threads[t], NULL, run, (void *)t);
    for (int t = 0; t < 4; t++) {
        void *result;
        pthread_join(threads[t], &result);
        total += (long)result;
    }
    printf("total %ld\n", total);
    return 0;
}
