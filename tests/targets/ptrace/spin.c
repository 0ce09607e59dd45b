/* Runs until killed: one call and one line per tick, for attaching with -p. */
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) long tick(long i)
{
    return i * 7;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (long i = 0;; i++) {
        printf("tick %ld %ld\n", i, tick(i));
        usleep(20000);
    }
}
