/* A small call tree for the user-space function tracer: main -> g -> f, three times. */
#include <stdio.h>

__attribute__((noinline)) int f(int x)
{
    return x * 3;
}

__attribute__((noinline)) int g(int x)
{
    return f(x) + 1;
}

int main(void)
{
    int sum = 0;
    for (int i = 0; i < 3; i++)
        sum += g(i);
    printf("%d\n", sum);
    return 0;
}
