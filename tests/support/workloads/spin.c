/* spin SECONDS: a CPU-bound busy loop that ends by itself after SECONDS (at most 30). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    if (secs <= 0 || secs > 30) secs = 30;
    double end = now() + secs;
    volatile unsigned long x = 0;
    printf("ready\n");
    fflush(stdout);
    while (now() < end)
        for (int i = 0; i < 100000; i++) x += i;
    return 0;
}
