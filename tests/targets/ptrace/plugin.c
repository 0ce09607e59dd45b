/* A library loaded with dlopen after the probes were attached. */
int plugin_fn(int x)
{
    return x * x + 1;
}
