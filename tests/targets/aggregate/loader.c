/* dlopen the library named in argv[1] (built from plugin.c) after the probes were armed, call
 * plug_entry(argv[2]) in it, and exit without dlclose. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    void *handle = dlopen(argv[1], RTLD_NOW);
    if (!handle) {
        printf("dlopen: %s\n", dlerror());
        return 1;
    }
    long (*entry)(long) = (long (*)(long))dlsym(handle, "plug_entry");
    printf("%ld\n", entry(atol(argv[2])));
    return 0;
}
