/* probescope's demo target: the loop from the kernel's uprobetracer documentation, grown a
 * little so every argument type has something to show (ints, a string, a struct). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct point {
    int x;
    int y;
};

__attribute__((noinline)) int func_1(int a)
{
    return a * 2;
}

__attribute__((noinline)) int func_2(int a, int b)
{
    return a + b;
}

__attribute__((noinline)) size_t greet(const char *name, const struct point *where)
{
    printf("hello %s at (%d,%d)\n", name, where->x, where->y);
    return strlen(name);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    int delay_ms = argc > 2 ? atoi(argv[2]) : 100;
    static const char *names[] = {"ada", "grace", "linus", "barbara"};
    long total = 0;

    for (int i = 0; i < rounds; i++) {
        struct point where = {i, -i};
        total += func_1(i);
        total += func_2(i, 10 * i);
        total += (long)greet(names[i % 4], &where);
        if (delay_ms)
            usleep(delay_ms * 1000);
    }
    printf("total %ld\n", total);
    return 0;
}
