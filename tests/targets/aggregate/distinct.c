/* probed(i) for i = 0 .. argv[1]-1 (default 1000), each value once; built with frame pointers,
 * so probed() starts with `push %rbp`, which the kernel emulates (no single-step per hit). */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long probed(long x) { asm volatile("" ::: "memory"); return x + 1; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000, sum = 0;
    for (long i = 0; i < n; i++)
        sum += probed(i);
    printf("%ld\n", sum);
    return 0;
}
