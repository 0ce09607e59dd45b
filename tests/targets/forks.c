/* The parent and two generations of children call step() with their generation. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

volatile int steps;

__attribute__((noinline)) int step(int generation)
{
    steps += generation;
    return generation + 1;
}

int main(void)
{
    int generation = 0;
    step(generation);
    for (int i = 0; i < 2; i++) {
        pid_t child = fork();
        if (child == 0) {
            generation++;
            step(generation);
            continue;
        }
        waitpid(child, NULL, 0);
        break;
    }
    printf("generation %d done\n", generation);
    return 0;
}
