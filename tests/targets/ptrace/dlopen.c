/* dlopen a library given on the command line, call it, close it, open it again. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    for (int round = 0; round < 2; round++) {
        void *h = dlopen(argv[1], RTLD_NOW);
        if (!h) {
            printf("dlopen: %s\n", dlerror());
            return 1;
        }
        int (*fn)(int) = (int (*)(int))dlsym(h, "plugin_fn");
        int sum = 0;
        for (int i = 0; i < 3; i++)
            sum += fn(i + round);
        printf("round %d sum=%d\n", round, sum);
        dlclose(h);
    }
    return 0;
}
