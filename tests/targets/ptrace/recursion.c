/* Nested return probes: fib recursion, plus a tail call chain (tail_a jumps to tail_b). */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long fib(long n)
{
    if (n < 2)
        return n;
    return fib(n - 1) + fib(n - 2);
}

__attribute__((noinline)) long tail_b(long x)
{
    __asm__ volatile("" ::: "memory");
    return x * 3;
}

__attribute__((noinline, optimize("O2"))) long tail_a(long x)
{
    return tail_b(x + 1);
}

__attribute__((noinline)) long deep(long n)
{
    if (n == 0)
        return 0;
    return deep(n - 1) + 1;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 6;
    printf("fib(%ld)=%ld\n", n, fib(n));
    printf("tail=%ld\n", tail_a(4));
    printf("deep=%ld\n", deep(100));
    return 0;
}
