/* switcher SECONDS: two threads of one process pass a byte back and forth over two pipes
 * (pin the process to one CPU: every round is then two wake-ups and two context switches),
 * from a line on stdin for SECONDS (at most 60); prints "ready" first, then the rounds done.
 * A service with a known, high context-switch rate for measuring a probe's cost. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ab[2], ba[2];

static void *echo(void *arg) {
    (void)arg;
    char c;
    for (;;)
        if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1) return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1;
    if (seconds <= 0 || seconds > 60) seconds = 1;
    if (pipe(ab) || pipe(ba)) return 1;
    pthread_t t;
    pthread_create(&t, NULL, echo, NULL);
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 1;
    long rounds = 0;
    char c = 0;
    double end = now() + seconds;
    while (now() < end) {
        for (int i = 0; i < 100; i++, rounds++)
            if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1) return 1;
    }
    printf("%ld\n", rounds);
    fflush(stdout);
    return 0;
}
