/* Five mallocs reported with write(2) (stdio would malloc its buffer behind our back). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(void)
{
    char line[64];
    int failed = 0;
    for (int i = 1; i <= 5; i++) {
        void *p = malloc(1000 * i);
        int n = snprintf(line, sizeof line, "malloc #%d (%d bytes): %s\n", i, 1000 * i,
                         p ? "ok" : "NULL");
        write(1, line, n);
        failed += p == NULL;
        free(p);
    }
    return failed;
}
