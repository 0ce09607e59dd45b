/* Three call paths (and one through two of them) reaching one probed leaf, in bursts:
 * stack_paths BURSTS GAP_MS runs BURSTS bursts GAP_MS apart, each burst calling
 * leaf 3x from path_a, 2x from path_b directly, 2x via path_b -> path_a and 1x from path_c. */
#include <stdlib.h>
#include <unistd.h>

volatile int sink;

__attribute__((noinline)) void leaf(int x) { sink += x; }
__attribute__((noinline)) void path_a(void) { leaf(1); }
__attribute__((noinline)) void path_b(void) { leaf(2); path_a(); }
__attribute__((noinline)) void path_c(void) { leaf(3); }

int main(int argc, char **argv) {
    int bursts = argc > 1 ? atoi(argv[1]) : 1;
    int gap_ms = argc > 2 ? atoi(argv[2]) : 0;
    for (int b = 0; b < bursts; b++) {
        if (b && gap_ms)
            usleep(gap_ms * 1000);
        for (int i = 0; i < 3; i++)
            path_a();
        for (int i = 0; i < 2; i++)
            path_b();
        path_c();
    }
    return 0;
}
