/* An ELFCLASS32 (i386) program with USDT probes: 4-byte addresses in the notes.
 *
 * Built with -m32 -nostdlib -static (no 32-bit libc needed): it prints the values it passes,
 * "p32:hit v1 v2 v3", with raw system calls, fires the probe, and exits.
 */
#include <sys/sdt.h>

volatile int seed = -123;

static void write_text(const char *text, int length)
{
    int ignored;
    __asm__ __volatile__("int $0x80" : "=a"(ignored) : "a"(4), "b"(1), "c"(text), "d"(length)
                         : "memory");
}

static void write_number(long long value)
{
    char digits[24];
    int at = sizeof digits;
    unsigned long long magnitude = value < 0 ? -(unsigned long long)value : value;
    do {
        digits[--at] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (value < 0)
        digits[--at] = '-';
    digits[--at] = ' ';
    write_text(digits + at, (int)sizeof digits - at);
}

void _start(void)
{
    int x = seed;
    short y = (short)(seed * 3);
    long long z = (long long)seed * 100000000LL;
    write_text("p32:hit", 7);
    write_number(x);
    write_number(y);
    write_number(z);
    write_text("\n", 1);
    STAP_PROBE3(p32, hit, x, y, z);
    __asm__ __volatile__("int $0x80" :: "a"(1), "b"(0));
    __builtin_unreachable();
}
