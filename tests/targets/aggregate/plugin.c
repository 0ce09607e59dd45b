/* A library loaded with dlopen: plug_entry calls plug_leaf n times. */
__attribute__((noinline)) long plug_leaf(long x) { asm volatile("" ::: "memory"); return x + 7; }

long plug_entry(long n) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += plug_leaf(i);
    asm volatile("" ::: "memory");
    return s;
}
