/* A program that runs for about a second, calling a probed function, then reports. */
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) long step(long i)
{
    return i * 3 + 1;
}

int main(void)
{
    long sum = 0;
    for (long i = 0; i < 200; i++) {
        sum += step(i);
        usleep(5000);
    }
    printf("done sum=%ld\n", sum);
    return 0;
}
