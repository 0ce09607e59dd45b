/* Calls the assembly functions of tests/unit/fentry/shapes.py (appended when built): some the
 * fentry engine patches, some it must refuse. */
int loop_head(void);
int riprel(void);
int tiny_padded(void);
int flags_own(int);
int with_endbr(int);
int back_to_entry(int);

int main(void)
{
    int sum = 0;
    for (int i = 0; i < 3; i++)
        sum += loop_head() + riprel() + tiny_padded() + flags_own(i) + with_endbr(i) +
               back_to_entry(i + 1);
    return sum & 0x7f;
}
