/* futex_contend THREADS SECONDS: THREADS threads take turns on one pthread mutex and hold it
 * while they work (about 50 us), so the others wait in futex(2). Ends by itself after
 * SECONDS (at most 30). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static double end;
static volatile unsigned long shared;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *worker(void *arg) {
    (void)arg;
    while (now() < end) {
        pthread_mutex_lock(&lock);
        double until = now() + 50e-6;
        while (now() < until) shared++;
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    double secs = argc > 2 ? atof(argv[2]) : 1.0;
    if (n < 1 || n > 16) n = 4;
    if (secs <= 0 || secs > 30) secs = 30;
    end = now() + secs;
    pthread_t th[16];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, worker, NULL);
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    return 0;
}
