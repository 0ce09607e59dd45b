/* USDT probes with semaphores, for probescope's USDT tests.
 *
 * sdt.h's recipe: define _SDT_HAS_SEMAPHORES before including it, and give every probe of the
 * translation unit an `unsigned short PROVIDER_NAME_semaphore` in section ".probes"; its
 * address goes into the note. The kernel adds 1 to it while a uprobe with that (REF) is
 * enabled. `gated:hit` only fires (and only computes its arguments) when its semaphore is set,
 * the way Python's and other runtimes' probes do; `gated:always` fires every time.
 *
 * Prints "gated:hit v1 v2" / "gated:always v1" before each probe fires, and at the end
 * "semaphore N M": the values of both semaphores then.
 *
 * Usage: usdt_gated [ITERATIONS]
 */
#define _SDT_HAS_SEMAPHORES 1
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

unsigned short gated_hit_semaphore __attribute__((unused, section(".probes")));
unsigned short gated_always_semaphore __attribute__((unused, section(".probes")));

#define ENABLED(semaphore) __builtin_expect(*(volatile unsigned short *)&(semaphore), 0)

__attribute__((noinline)) static long expensive(int i)
{
    long total = 0;
    for (int k = 0; k <= i; k++)
        total += k * 1000003L;
    return -total;
}

int main(int argc, char **argv)
{
    int iterations = argc > 1 ? atoi(argv[1]) : 3;
    for (int i = 0; i < iterations; i++) {
        if (ENABLED(gated_hit_semaphore)) {
            long value = expensive(i);
            printf("gated:hit %d %ld\n", i, value);
            STAP_PROBE2(gated, hit, i, value);
        }
        printf("gated:always %d\n", -i);
        STAP_PROBE1(gated, always, -i);
    }
    printf("semaphore %u %u\n", gated_hit_semaphore, gated_always_semaphore);
    return 0;
}
