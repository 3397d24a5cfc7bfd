/* alloc MODE SECONDS: a request loop that either allocates per request (MODE "alloc":
 * malloc/calloc/realloc/free in the loop) or works on buffers allocated once at start-up
 * (MODE "prealloc"). About 2000 requests/s; ends by itself after SECONDS (at most 60). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static char *pool;

__attribute__((noinline)) static unsigned handle_request_alloc(int i) {
    char *buf = malloc(256 + (i & 63));
    memset(buf, i, 256);
    char *more = realloc(buf, 512);
    unsigned *tab = calloc(16, sizeof(unsigned));
    unsigned sum = (unsigned char)more[10] + tab[3];
    free(tab);
    free(more);
    return sum;
}

__attribute__((noinline)) static unsigned handle_request_prealloc(int i) {
    memset(pool, i, 512);
    return (unsigned char)pool[10];
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int alloc = strcmp(argv[1], "alloc") == 0;
    double secs = atof(argv[2]);
    if (secs <= 0 || secs > 60) secs = 60;
    pool = malloc(4096);
    double end = now() + secs;
    volatile unsigned sink = 0;
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; now() < end; i++) {
        sink += alloc ? handle_request_alloc(i) : handle_request_prealloc(i);
        usleep(500);
    }
    return 0;
}
