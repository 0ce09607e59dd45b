/* A loop calling one function with an int, a string and a bitfield struct; exits 3. */
#include <stdio.h>
#include <stdlib.h>

struct bits {
    unsigned a : 3, b : 5, c : 7;
};

long counter = 7;

__attribute__((noinline)) int work(int i, const char *name, struct bits *b)
{
    counter += i;
    return i * 2 + name[0] + b->b;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 5;
    struct bits b = {5, 17, 99};
    long sum = 0;
    for (int i = 0; i < n; i++)
        sum += work(i, i % 2 ? "odd" : "even", &b);
    printf("sum=%ld counter=%ld\n", sum, counter);
    return 3;
}
