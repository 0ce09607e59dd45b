/* Calls step(n) once for each line read from stdin (as bash calls readline), then exits at
 * end of input printing how many steps it took: a program whose last event comes long before
 * its end, or never, if nobody closes its input. */
#include <stdio.h>

__attribute__((noinline)) int step(int n)
{
    return n + 1;
}

int main(void)
{
    char line[256];
    int steps = 0;
    while (fgets(line, sizeof line, stdin))
        steps = step(steps);
    printf("steps %d\n", steps);
    return 0;
}
