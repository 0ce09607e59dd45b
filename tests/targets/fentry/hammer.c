/* Four threads call probed functions (entry and return probes) as fast as they can for
 * argv[1] seconds (or, given "stdin", until its stdin closes), going through recursion and
 * a longjmp; each keeps a
 * checksum that any corrupted return value, register, stack slot or return address would
 * change. Prints "good N" (threads whose checksum held) and exits with the number that failed.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

__attribute__((noinline)) long deep(long n, long a)
{
    return n == 0 ? layer(a, n) : deep(n - 1, a) + 1;
}

__attribute__((noinline)) void bail(jmp_buf *where, long n)
{
    if (n & 1)
        longjmp(*where, 2);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double seconds = 1.0;
static volatile int stop;

static void *run(void *arg)
{
    long id = (long)arg, sum = 0, expect = 0, calls = 0;
    double end = now() + seconds;
    while (seconds < 0 ? !stop : now() < end) {
        for (int i = 0; i < 100; i++, calls++) {
            long a = id + calls, b = calls;
            sum = (sum + deep(calls % 5, a) + layer(a, b)) % 1000003;
            long m1 = (a * 31 + (calls % 5 == 0 ? 0 : 0)) % 1000003;
            (void)m1;
            long base = ((a * 31) % 1000003 + (0 * 31 + a) % 1000003) + calls % 5;
            expect = (expect + base + ((a * 31 + b) % 1000003 + (b * 31 + a) % 1000003)) % 1000003;
            jmp_buf where;
            if (setjmp(where) == 0)
                bail(&where, calls);
        }
    }
    return (void *)(long)(sum == expect);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        seconds = strcmp(argv[1], "stdin") == 0 ? -1 : atof(argv[1]);
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, run, (void *)i);
    if (seconds < 0) {
        while (getchar() != EOF)
            ;
        stop = 1;
    }
    int good = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        good += (long)r;
    }
    printf("good %d\n", good);
    return THREADS - good;
}
