/* Runs the dead man's switch image on its own, without a tracer: the states a killed
 * probescope leaves a thread in, one scenario per run.
 *
 * usage: switch_harness IMAGE_FILE SCENARIO site_count trampoline injection_resume
 *        saved_gregs action handler restorer proc_self_mem SITES_OFFSET RETURNS_OFFSET AREA_SIZE
 * (offsets in hex, from dead_mans_switch_code.py). Prints what each scenario computed; the
 * test compares. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static unsigned char *area;
static unsigned long off[11];
enum { SITE_COUNT, TRAMPOLINE, INJECTION_RESUME, SAVED_GREGS, ACTION, HANDLER, RESTORER,
       PROC_SELF_MEM, SITES, RETURNS, AREA_SIZE };

static unsigned char *code_page(const unsigned char *bytes, size_t n)
{
    unsigned char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(page, 0xcc, 4096);
    memcpy(page, bytes, n);
    mprotect(page, 4096, PROT_READ | PROT_EXEC);
    return page;
}

/* Patch `length` bytes at `address` (through /proc/self/mem, as the tracer does) and record
 * the site: its original bytes and XOL slot. */
static void add_site(unsigned char *address, int length, unsigned char trap, unsigned long slot)
{
    uint64_t *count = (uint64_t *)(area + off[SITE_COUNT]);
    unsigned char *entry = area + off[SITES] + 32 * *count;
    memcpy(entry, &address, 8);
    memcpy(entry + 8, &slot, 8);
    memcpy(entry + 16, address, length);
    entry[31] = length;
    (*count)++;
    unsigned char patch[16];
    memset(patch, trap == 0xf4 ? 0xf4 : 0xcc, sizeof patch);
    int fd = open("/proc/self/mem", O_RDWR);
    pwrite(fd, patch, length, (off_t)(uintptr_t)address);
    close(fd);
}

static int install(int signal)
{
    uint64_t *action = (uint64_t *)(area + off[ACTION]);
    action[0] = (uint64_t)(uintptr_t)(area + off[HANDLER]);
    action[2] = (uint64_t)(uintptr_t)(area + off[RESTORER]);
    return (int)syscall(SYS_rt_sigaction, signal, action, NULL, 8);
}

int main(int argc, char **argv)
{
    if (argc < 14)
        return 2;
    for (int i = 0; i < 11; i++)
        off[i] = strtoul(argv[3 + i], NULL, 16);
    area = mmap(NULL, off[AREA_SIZE], PROT_READ | PROT_WRITE | PROT_EXEC,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    FILE *f = fopen(argv[1], "rb");
    size_t got = fread(area, 1, 65536, f);
    fclose(f);
    if (got == 0 || install(SIGTRAP) || install(SIGSEGV))
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *scenario = argv[2];
    /* push %rbp; mov %rsp,%rbp; mov $42,%eax; pop %rbp; ret */
    static const unsigned char f42[] = {0x55, 0x48, 0x89, 0xe5, 0xb8, 0x2a, 0, 0, 0, 0x5d, 0xc3};
    unsigned char *fn = code_page(f42, sizeof f42);
    int (*call)(void) = (int (*)(void))fn;

    if (!strcmp(scenario, "hlt")) {            /* a one-byte instruction under `hlt` */
        add_site(fn, 1, 0xf4, 0);
        printf("result %d\n", call());
    } else if (!strcmp(scenario, "int3")) {    /* a three-byte instruction under int3s */
        add_site(fn + 1, 3, 0xcc, 0);
        printf("result %d\n", call());
    } else if (!strcmp(scenario, "tail")) {    /* resumed one byte into its int3s */
        static const unsigned char g42[] = {0xb8, 0x2a, 0, 0, 0, 0xc3};  /* mov $42,%eax; ret */
        unsigned char *g = code_page(g42, sizeof g42);
        add_site(g, 5, 0xcc, 0);
        add_site(fn, 1, 0xf4, 0);
        printf("result %d\n", ((int (*)(void))(g + 1))());
        printf("other site restored %d\n", memcmp(g, g42, sizeof g42) == 0);
    } else if (!strcmp(scenario, "slot")) {    /* text not writable: the displaced copy runs */
        /* mov $42,%eax; jmp *0(%rip) back to pop %rbp */
        unsigned char slot_code[19] = {0xb8, 0x2a, 0, 0, 0, 0xff, 0x25, 0, 0, 0, 0};
        uint64_t back = (uint64_t)(uintptr_t)(fn + 9);
        memcpy(slot_code + 11, &back, 8);
        unsigned char *slot = code_page(slot_code, sizeof slot_code);
        add_site(fn + 4, 5, 0xcc, (unsigned long)(uintptr_t)slot);
        strcpy((char *)(area + off[PROC_SELF_MEM]), "/nonexistent");
        printf("result %d\n", call());
        printf("still patched %d\n", fn[4] == 0xcc);
        return 0;
    } else if (!strcmp(scenario, "trampoline")) {  /* a return through the trampoline */
        static const unsigned char f7[] = {0xb8, 0x07, 0, 0, 0, 0xc3};
        unsigned char *seven = code_page(f7, sizeof f7);
        unsigned char *tramp = code_page((const unsigned char *)"", 0);
        memcpy(area + off[TRAMPOLINE], &tramp, 8);
        uint64_t *entry = (uint64_t *)(area + off[RETURNS] + 16 * 5);
        long result;
        __asm__ volatile(
            "lea 1f(%%rip), %%rcx\n\t"
            "mov %%rcx, 8(%[entry])\n\t"
            "lea -8(%%rsp), %%rcx\n\t"
            "mov %%rcx, 0(%[entry])\n\t"
            "push %[tramp]\n\t"
            "jmp *%[fn]\n"
            "1:\n\t"
            : "=a"(result)
            : [entry] "r"(entry), [tramp] "r"(tramp), [fn] "r"(seven)
            : "rcx", "memory");
        printf("result %ld\n", result);
    } else if (!strcmp(scenario, "injection")) {  /* caught after an injected syscall */
        static volatile int resumed;
        static ucontext_t context;  /* zeroed: getcontext leaves rax, eflags... alone */
        getcontext(&context);
        if (resumed) {
            printf("resumed with the saved registers\n");
            return 0;
        }
        resumed = 1;
        memcpy(area + off[SAVED_GREGS], context.uc_mcontext.gregs, 18 * 8);
        unsigned char *trap = code_page((const unsigned char *)"\xcc", 1);
        uint64_t resume = (uint64_t)(uintptr_t)(trap + 1);
        memcpy(area + off[INJECTION_RESUME], &resume, 8);
        ((void (*)(void))trap)();
        printf("not resumed\n");
    } else if (!strcmp(scenario, "own-int3")) {    /* the program's own int3: default action */
        __asm__ volatile("int3");
        printf("survived\n");
    } else if (!strcmp(scenario, "own-segv")) {    /* the program's own fault: default action */
        *(volatile int *)16 = 1;
        printf("survived\n");
    } else if (!strcmp(scenario, "kill")) {        /* SIGTRAP sent by a process */
        kill(getpid(), SIGTRAP);
        printf("survived\n");
    } else {
        return 2;
    }
    int unchanged = memcmp(fn, f42, sizeof f42) == 0;
    printf("text restored %d\n", unchanged);
    return 0;
}
