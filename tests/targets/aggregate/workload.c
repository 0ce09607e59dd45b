/* Known work for the aggregation tests; argv[1] picks it:
 * counts: alpha 100 times and beta 37 times in main, alpha 10, 20 and 30 times in 3 threads;
 * hist:   beta(v) for v = 0..63 once each and beta(-5) three times;
 * fib:    fib(15) (1973 calls, recursive);
 * jump:   three rounds of jumper(3), which longjmps out of 4 nested calls;
 * nap:    nap(MS) COUNT times (argv[2] = COUNT, default 5; argv[3] = MS, default 20). */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) int alpha(int x) { asm volatile("" ::: "memory"); return x + 1; }
__attribute__((noinline)) int beta(int x) { asm volatile("" ::: "memory"); return x * 2; }
__attribute__((noinline)) long fib(long n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

static jmp_buf env;
__attribute__((noinline)) void jumper(int depth) {
    if (depth == 0)
        longjmp(env, 1);
    jumper(depth - 1);
    asm volatile("" ::: "memory");
}

__attribute__((noinline)) void nap(int ms) { usleep(ms * 1000); }

static void *worker(void *arg) {
    long n = (long)arg;
    for (long i = 0; i < n; i++)
        alpha((int)i);
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "counts";
    long sum = 0;
    if (!strcmp(mode, "counts")) {
        pthread_t threads[3];
        for (int i = 0; i < 100; i++)
            sum += alpha(i);
        for (int i = 0; i < 37; i++)
            sum += beta(i);
        for (long t = 0; t < 3; t++)
            pthread_create(&threads[t], NULL, worker, (void *)(10 * (t + 1)));
        for (int t = 0; t < 3; t++)
            pthread_join(threads[t], NULL);
    } else if (!strcmp(mode, "hist")) {
        for (int v = 0; v < 64; v++)
            sum += beta(v);
        for (int i = 0; i < 3; i++)
            sum += beta(-5);
    } else if (!strcmp(mode, "fib")) {
        sum = fib(15);
    } else if (!strcmp(mode, "jump")) {
        for (int i = 0; i < 3; i++)
            if (!setjmp(env))
                jumper(3);
    } else if (!strcmp(mode, "nap")) {
        int count = argc > 2 ? atoi(argv[2]) : 5, ms = argc > 3 ? atoi(argv[3]) : 20;
        for (int i = 0; i < count; i++)
            nap(ms);
    }
    printf("%ld\n", sum);
    return 0;
}
