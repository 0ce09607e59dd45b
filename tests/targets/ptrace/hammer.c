/* Threads calling probed functions as fast as they can until a line arrives on stdin, then a
 * checksum that any corrupted call, return or register would change, and how many SIGRTMIN
 * the program received (each one sent is queued); then it waits for a second line before it
 * exits, so that its text can be compared with the file.
 * usage: hammer [THREADS [blocked]]  (blocked: the threads block every signal, as many
 * libraries' worker threads do) */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_THREADS 16

static volatile int stop;
static int blocked;
static int ready;
static long received;

static void count(int signum)
{
    (void)signum;
    __atomic_fetch_add(&received, 1, __ATOMIC_RELAXED);
}

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
    if (blocked) {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, NULL);
    }
    __atomic_fetch_add(&ready, 1, __ATOMIC_RELEASE);
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
    blocked = argc > 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sigaction action = {.sa_handler = count, .sa_flags = SA_RESTART};
    sigaction(SIGRTMIN, &action, NULL);
    pthread_t t[MAX_THREADS];
    for (long i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, run, (void *)i);
    while (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) < threads)
        ;
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
    printf("threads with a correct checksum: %d of %d, signals %ld\n", good, threads,
           __atomic_load_n(&received, __ATOMIC_RELAXED));
    if (!fgets(line, sizeof line, stdin))
        return 3;
    return good == threads ? 0 : 1;
}
