/* The kernel docs' uprobe example grown a little: func_1/func_2 in a loop, plus a string and
 * a struct argument. Waits for a line on stdin before starting when given "wait". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pair {
    int first;
    short second;
    unsigned char flags;
};

__attribute__((noinline)) int func_1(int a) { return a * 3; }
__attribute__((noinline)) long func_2(long a, int b) { return a - b; }
__attribute__((noinline)) int named(const char *name, struct pair *p)
{
    return (int)strlen(name) + p->first + p->second + p->flags;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    char line[16];
    static const char *names[] = {"alpha", "beta", "gamma"};
    long total = 0;
    if (argc > 2 && strcmp(argv[2], "wait") == 0 && !fgets(line, sizeof line, stdin))
        return 3;
    for (int i = 0; i < rounds; i++) {
        struct pair p = {i, (short)-i, (unsigned char)(i * 7)};
        total += func_1(i);
        total += func_2(i * 100L, -i);
        total += named(names[i % 3], &p);
    }
    printf("total %ld\n", total);
    return 0;
}
