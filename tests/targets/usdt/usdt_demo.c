/* USDT probes without semaphores, for probescope's USDT tests.
 *
 * Before each probe fires the program prints "provider:name v1 v2 ...": the values it passes,
 * as decimal integers (floating-point arguments as their raw bits, unsigned), "-" where an
 * argument cannot be fetched by a uprobe. The `demo` probes use <sys/sdt.h>, so the compiler
 * chooses the operands (-O0: stack slots; -O2: registers, constants, %rip-relative globals,
 * base+index addressing); the `hand` probes are notes written by hand to pin down every
 * register width and memory form, including ones probescope must refuse.
 *
 * Usage: usdt_demo [ITERATIONS]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>

int g_counter = 42;
long g_pair[2] = {-7000000000L, 9000000001L};
struct point { int x; long y; } g_point = {5, -6};
long g_table[4] = {10, -20, 30, -40};

/* A probe note written by hand: `args` is the argument string exactly as stored (with %% for
 * one % inside an asm with operands). */
#define HAND_NOTE(name, args)                                                   \
    "990: nop\n"                                                                \
    ".pushsection .note.stapsdt,\"\",\"note\"\n"                                \
    ".balign 4\n"                                                               \
    ".4byte 992f-991f, 994f-993f, 3\n"                                          \
    "991: .asciz \"stapsdt\"\n"                                                 \
    "992: .balign 4\n"                                                          \
    "993: .8byte 990b\n"                                                        \
    ".8byte _.stapsdt.base\n"                                                   \
    ".8byte 0\n"                                                                \
    ".asciz \"hand\"\n"                                                         \
    ".asciz \"" name "\"\n"                                                     \
    ".asciz \"" args "\"\n"                                                     \
    "994: .balign 4\n"                                                          \
    ".popsection\n"

static unsigned long long bits64(double value)
{
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static unsigned bits32(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static inline __attribute__((always_inline)) void inlined(int value)
{
    printf("demo:inlined %d\n", value);
    STAP_PROBE1(demo, inlined, value);
}

__attribute__((noinline)) void ints(int i, long l, short s, signed char c, unsigned u,
                                    unsigned long long big)
{
    printf("demo:ints %d %ld %d %d %u %llu\n", i, l, s, c, u, big);
    STAP_PROBE6(demo, ints, i, l, s, c, u, big);
}

__attribute__((noinline)) void literals(void)
{
    printf("demo:literals %d %lld %u %d\n", -5, 123456789012LL, 200u, 0);
    STAP_PROBE4(demo, literals, -5, 123456789012LL, (unsigned char)200, 0);
}

__attribute__((noinline)) void pointers(const char *text, long *slot)
{
    printf("demo:pointers %llu %llu\n", (unsigned long long)(uintptr_t)text,
           (unsigned long long)(uintptr_t)slot);
    STAP_PROBE2(demo, pointers, text, slot);
}

__attribute__((noinline)) void globals(void)
{
    printf("demo:globals %d %ld %d\n", g_counter, g_point.y, g_point.x);
    STAP_PROBE3(demo, globals, g_counter, g_point.y, g_point.x);
}

__attribute__((noinline)) void floats(double d, float f)
{
    printf("demo:floats %llu %u\n", bits64(d), bits32(f));
    STAP_PROBE2(demo, floats, d, f);
}

__attribute__((noinline)) void indexed(int i, const char *text)
{
    printf("demo:indexed %ld %d\n", g_table[i & 3], text[i & 1]);
    STAP_PROBE2(demo, indexed, g_table[i & 3], text[i & 1]);
}

__attribute__((noinline)) void eight(int i)
{
    long a = i, b = -i, c = i * 1000L, d = -i * 1000L;
    int e = i + 1, f = -(i + 1);
    short g = (short)(i * 3);
    unsigned char h = (unsigned char)(250 + i);
    printf("demo:eight %ld %ld %ld %ld %d %d %d %u\n", a, b, c, d, e, f, g, h);
    STAP_PROBE8(demo, eight, a, b, c, d, e, f, g, h);
}

/* Every x86-64 register width sdt.h may name; the SIZE before @ governs (8@%edi reads rdi). */
__attribute__((noinline)) void hand_widths(long i)
{
    long cx = -1000 - i, r9 = 0x12340000L + i, si = -3 - i, r8 = 0x123456789aL * (i + 1);
    long r10 = -70000 - i, r11 = 0x80 + i, bx = -300 - i, di = 0x100000000L + i;
    printf("hand:widths %d %d %d %ld %d %d %d %ld\n", (int)cx, (short)r9, (signed char)si, r8,
           (int)r10, (signed char)r11, (short)bx, di);
    /* Local register variables: set after the call to printf, which may clobber them. */
    register long r8_ __asm__("r8") = r8;
    register long r9_ __asm__("r9") = r9;
    register long r10_ __asm__("r10") = r10;
    register long r11_ __asm__("r11") = r11;
    __asm__ __volatile__(
        HAND_NOTE("widths", "-4@%%ecx -2@%%r9w -1@%%sil 8@%%r8 -4@%%r10d -1@%%r11b -2@%%bx "
                            "8@%%edi")
        :: "c"(cx), "r"(r9_), "S"(si), "r"(r8_), "r"(r10_), "r"(r11_), "b"(bx), "D"(di)
        : "memory");
}

/* Memory through a base register, with and without displacement. */
__attribute__((noinline)) void hand_memory(long i)
{
    long words[4] = {-11 - i, 0x7fffffff00000005L + i, 33 + i, -44 - i};
    printf("hand:memory %ld %d %ld %d\n", words[0], (int)words[1], words[2], (short)words[3]);
    __asm__ __volatile__(
        HAND_NOTE("memory", "-8@(%%rbx) -4@8(%%rbx) 8@-8(%%rdx) -2@(%%rdx)")
        :: "b"(words), "d"(&words[3]) : "memory");
}

/* Symbol-relative operands: %rip-relative with the offset on either side, and an absolute
 * symbolic address (both mean the link-time address of the symbol). */
__attribute__((noinline)) void hand_symbols(long i)
{
    g_counter = 42 + (int)i;
    printf("hand:symbols %d %ld %ld %d %ld\n", g_counter, g_pair[1], g_pair[1], g_counter,
           g_pair[0]);
    __asm__ __volatile__(
        HAND_NOTE("symbols", "-4@g_counter(%%rip) -8@g_pair+8(%%rip) -8@8+g_pair(%%rip) "
                             "-4@g_counter -8@g_pair")
        ::: "memory");
}

/* An address as an immediate: a constant in an ET_EXEC file, unknowable in a PIE. */
__attribute__((noinline)) void hand_address(void)
{
    printf("hand:address %llu\n", (unsigned long long)(uintptr_t)&g_counter);
    __asm__ __volatile__(HAND_NOTE("address", "8@$g_counter") ::: "memory");
}

/* Forms a uprobe cannot fetch; the last argument can be, and must still be. */
__attribute__((noinline)) void hand_refused(long i)
{
    printf("hand:refused - - - - - %ld\n", i);
    __asm__ __volatile__(
        HAND_NOTE("refused", "8@(%%rbx,%%rcx,8) 8f@%%xmm0 8@%%fs:0x28 1@%%ah 16@%%rax 8@%%rdx")
        :: "b"(g_table), "c"(1L), "a"(0x1234L), "d"(i) : "memory");
}

int main(int argc, char **argv)
{
    int iterations = argc > 1 ? atoi(argv[1]) : 3;
    long slot = 0;
    char text[] = "usdt";
    DTRACE_PROBE(demo, start);
    printf("demo:start\n");
    for (int i = 0; i < iterations; i++) {
        ints(i - 1, -100000L * i, (short)(-3 - i), (signed char)(-9 + i), 3000000000u + i,
             18446744073709551615ULL - i);
        literals();
        pointers(text + i, &slot);
        g_counter = 42 + i;
        g_point.y = -6 - i;
        globals();
        floats(1.5 + i, 2.5f - i);
        indexed(i, text);
        eight(i);
        inlined(i);
        if (i % 2)
            inlined(-i);
        hand_widths(i);
        hand_memory(i);
        hand_symbols(i);
        hand_address();
        hand_refused(i);
    }
    return 0;
}
