/* Data for fetch arguments of every form: corpus_probe(node, text, n) is called with a node
 * that points to itself (so dereference chains of any depth stay valid), holds numbers of
 * every size, a name, and a pointer table for string[N]; `text` is a string literal the
 * program itself never reads (its page may not be resident when the probe fires). */
#include <stdio.h>
#include <string.h>

struct node {
    struct node *self;
    long value;
    unsigned char bytes[16];
    char name[16];
    const char *names[4];
    short small;
    int word;
    unsigned long long big;
    char padding[128];
};

struct node shared = {
    .value = -123456789,
    .name = "node-name",
    .small = -2,
    .word = 0x12345678,
    .big = 0xfedcba9876543210ull,
};

__attribute__((noinline)) long corpus_probe(struct node *node, const char *text, long n)
{
    return node->value + n + (text != 0);
}

__attribute__((noinline)) int filter_probe(int number, const char *word)
{
    return number + (int)strlen(word);
}

int main(int argc, char **argv)
{
    static const char *words[] = {"alpha", "beta", "gamma", "delta", "alphabet", "", "betamax"};
    shared.self = &shared;
    for (int i = 0; i < 16; i++)
        shared.bytes[i] = (unsigned char)(i * 17);
    shared.names[0] = "first";
    shared.names[1] = "second";
    shared.names[2] = 0;
    shared.names[3] = "fourth";
    long total = 0;
    for (int i = 0; i < 2; i++)
        total += corpus_probe(&shared, "a literal never read by the program", i);
    for (int i = 0; i < 7; i++)
        total += filter_probe(i - 3, words[i]);
    printf("%ld\n", total);
    return 0;
}
