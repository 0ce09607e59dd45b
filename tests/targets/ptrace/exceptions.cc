// C++ exceptions thrown through functions that carry return probes.
#include <cstdio>
#include <stdexcept>

__attribute__((noinline)) int thrower(int n)
{
    if (n % 3 == 0)
        throw std::runtime_error("boom");
    return n;
}

__attribute__((noinline)) int wrapper(int n)
{
    return thrower(n) * 2;
}

__attribute__((noinline)) int outer(int n)
{
    try {
        return wrapper(n);
    } catch (const std::runtime_error &e) {
        return -1;
    }
}

int main()
{
    int total = 0;
    for (int i = 0; i < 7; i++)
        total += outer(i);
    std::printf("total=%d\n", total);
    try {
        wrapper(3);
    } catch (const std::exception &e) {
        std::printf("caught in main: %s\n", e.what());
    }
    return 0;
}
