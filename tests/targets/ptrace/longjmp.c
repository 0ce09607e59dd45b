/* longjmp out of functions whose return addresses are hijacked. */
#include <setjmp.h>
#include <stdio.h>

static jmp_buf env;

__attribute__((noinline)) int leaf(int n)
{
    if (n == 3)
        longjmp(env, n + 40);
    return n;
}

__attribute__((noinline)) int middle(int n)
{
    return leaf(n) + 1;
}

int main(void)
{
    int total = 0;
    for (int i = 0; i < 6; i++) {
        int r = setjmp(env);
        if (r) {
            printf("jumped %d\n", r);
            total += r;
            continue;
        }
        total += middle(i);
    }
    printf("total=%d\n", total);
    return 0;
}
