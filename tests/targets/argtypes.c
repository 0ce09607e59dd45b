/* Two threads, one pinned to each of the first two CPUs, call mix() with arguments of several
 * types (s8, u16, x32, s64, strings, char), so a recording holds interleaved per-CPU streams.
 * Strings include an empty one, a UTF-8 one, bytes that are not UTF-8 and NULL (a fault). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

static const char *words[] = {"alpha", "", "caf\xc3\xa9", "\xff\xfe not utf-8", NULL};
static int rounds = 100;

__attribute__((noinline)) long mix(signed char a, unsigned short b, unsigned int c, long d,
                                   const char *s, char letter)
{
    return a + b + (long)c + d + (s ? s[0] : 0) + letter;
}

static void *worker(void *arg)
{
    long cpu = (long)arg, total = 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)cpu, &set);
    sched_setaffinity(0, sizeof set, &set); /* best effort: one CPU machines still run */
    for (int i = 0; i < rounds; i++)
        total += mix((signed char)(i - 64), (unsigned short)(i * 997), 0xdead0000u + i,
                     -1000000000000L * i, words[i % 5], (char)('a' + i % 26));
    return (void *)total;
}

int main(int argc, char **argv)
{
    pthread_t threads[2];
    if (argc > 1)
        rounds = atoi(argv[1]);
    for (long cpu = 0; cpu < 2; cpu++)
        pthread_create(&threads[cpu], NULL, worker, (void *)cpu);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    puts("done");
    return 0;
}
