/* pingpong ROUNDS [SPIN_NS]: two processes pass a byte back and forth over two pipes ROUNDS
 * times (at most 10 million): every round is two wake-ups and two context switches. With
 * SPIN_NS the first process computes that long before each round (the switch rate falls).
 * Prints "ready" first and the elapsed seconds at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 10000;
    if (rounds < 1 || rounds > 10000000) rounds = 10000;
    long spin = argc > 2 ? atol(argv[2]) : 0;
    int ab[2], ba[2];
    if (pipe(ab) || pipe(ba)) return 1;
    printf("ready\n");
    fflush(stdout);
    double t0 = now();
    pid_t child = fork();
    char c = 0;
    if (child == 0) {
        for (long i = 0; i < rounds; i++)
            if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1) _exit(1);
        _exit(0);
    }
    for (long i = 0; i < rounds; i++) {
        if (spin > 0) {
            double until = now() + spin / 1e9;
            while (now() < until) {
            }
        }
        if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1) return 1;
    }
    waitpid(child, NULL, 0);
    printf("%.6f\n", now() - t0);
    return 0;
}
