/* exec: the same binary runs again with an argument; probes apply to the new image too. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) int work(int generation)
{
    return generation * 10;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc > 1 && strcmp(argv[1], "again") == 0) {
        printf("second image: %d\n", work(2));
        return 5;
    }
    printf("first image: %d\n", work(1));
    execl("/proc/self/exe", argv[0], "again", (char *)NULL);
    perror("execl");
    return 1;
}
