/* Known call paths for stack tests, built -O2 -fomit-frame-pointer: leaf() is reached through
 * mid_a (odd i) and mid_b (even i) from top(), and compare() is called back from libc's qsort,
 * which has no frame pointers on Debian. argv[1] is how many calls top() makes. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long leaf(long n) { asm volatile("" ::: "memory"); return n * 3; }
__attribute__((noinline)) long mid_a(long n) { long r = leaf(n) + 1; asm volatile("" ::: "memory"); return r; }
__attribute__((noinline)) long mid_b(long n) { long r = leaf(n + 1) + 2; asm volatile("" ::: "memory"); return r; }
__attribute__((noinline)) long top(long n) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += (i & 1) ? mid_a(i) : mid_b(i);
    return s;
}
__attribute__((noinline)) int compare(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    asm volatile("" ::: "memory");
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10;
    long values[8] = {5, 3, 7, 1, 8, 2, 6, 4};
    qsort(values, 8, sizeof(long), compare);
    printf("%ld %ld\n", top(n), values[0]);
    return 0;
}
