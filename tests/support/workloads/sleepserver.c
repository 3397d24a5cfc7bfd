/* sleepserver PORT SECONDS SLEEP_US EVERY: a TCP server on 127.0.0.1:PORT, one thread per
 * connection, answering each line with "ok\n" after 20 us of its own CPU time; one request in
 * EVERY (counted over all connections) first sleeps SLEEP_US in nanosleep(2): a slow request
 * whose time is a voluntary sleep off CPU, of known size. Prints "ready" once listening; ends
 * by itself after SECONDS (at most 60). */
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long sleep_us, every;
static atomic_long served;

static long cpu_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static void handle(void) {
    if (every > 0 && atomic_fetch_add(&served, 1) % every == every - 1) {
        struct timespec ts = {.tv_sec = sleep_us / 1000000, .tv_nsec = sleep_us % 1000000 * 1000};
        nanosleep(&ts, NULL);
    }
    long end = cpu_us() + 20;
    while (cpu_us() < end) {
    }
}

static void *conn(void *arg) {
    int fd = (int)(long)arg;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != '\n') continue;
            handle();
            if (write(fd, "ok\n", 3) != 3) goto out;
        }
    }
out:
    close(fd);
    return NULL;
}

static void *timer(void *arg) {
    sleep((unsigned)(long)arg);
    exit(0);
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: sleepserver PORT SECONDS SLEEP_US EVERY\n"); return 2; }
    int port = atoi(argv[1]);
    long seconds = atol(argv[2]);
    sleep_us = atol(argv[3]);
    every = atol(argv[4]);
    if (seconds < 1 || seconds > 60) seconds = 60;
    if (sleep_us < 0 || sleep_us > 1000000) sleep_us = 5000;
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1024)) { perror("bind"); return 1; }
    pthread_t t;
    pthread_create(&t, NULL, timer, (void *)seconds);
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        pthread_create(&t, NULL, conn, (void *)(long)c);
        pthread_detach(t);
    }
}
