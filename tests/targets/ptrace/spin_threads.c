/* Three threads that run until killed, each calling tick() with its own id. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) long tick(long id, long i)
{
    return id * 1000000 + i;
}

static void *run(void *arg)
{
    long id = (long)arg;
    for (long i = 0;; i++) {
        tick(id, i);
        usleep(10000);
    }
    return NULL;
}

int main(void)
{
    pthread_t t[3];
    for (long i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, run, (void *)(i + 1));
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("started\n");
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    return 0;
}
