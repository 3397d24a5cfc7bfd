/* cpuwork ITERATIONS: a fixed amount of CPU work (at most 10^11 iterations); prints "ready"
 * first and the elapsed seconds at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    long long n = argc > 1 ? atoll(argv[1]) : 100000000LL;
    if (n < 1 || n > 100000000000LL) n = 100000000LL;
    printf("ready\n");
    fflush(stdout);
    double t0 = now();
    volatile unsigned long long x = 0;
    for (long long i = 0; i < n; i++) x += i ^ (x >> 3);
    printf("%.6f\n", now() - t0);
    return 0;
}
