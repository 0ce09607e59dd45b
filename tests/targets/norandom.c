/* Runs argv[1..] with address space randomization off (like `setarch -R`, but calling nothing
 * that a probe on libc could catch before the exec). */
#include <stdio.h>
#include <sys/personality.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    personality(ADDR_NO_RANDOMIZE);
    execv(argv[1], argv + 1);
    perror("execv");
    return 127;
}
