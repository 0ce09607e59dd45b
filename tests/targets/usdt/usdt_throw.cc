// Throws and catches C++ exceptions, so libstdc++'s own USDT probe libstdcxx:throw fires
// (arguments: the exception object, its std::type_info). Prints "libstdcxx:throw OBJ TYPEINFO"
// per throw, as unsigned decimal addresses, after the catch (the object lives until then).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <typeinfo>

int main(int argc, char **argv)
{
    int iterations = argc > 1 ? std::atoi(argv[1]) : 2;
    for (int i = 0; i < iterations; i++) {
        try {
            throw i;
        } catch (int &caught) {
            std::printf("libstdcxx:throw %llu %llu\n",
                        (unsigned long long)(std::uintptr_t)&caught,
                        (unsigned long long)(std::uintptr_t)&typeid(int));
        }
    }
    return 0;
}
