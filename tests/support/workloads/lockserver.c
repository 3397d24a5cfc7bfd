/* lockserver PORT SECONDS HOLD_US EVERY [ADDR]: a TCP server on ADDR:PORT (default 127.0.0.1;
 * another address for a test network namespace), one thread per
 * connection, answering each line with "ok\n". Every request takes one global mutex; every
 * EVERY-th request (0: none) has a "holder" thread take it and hold it for HOLD_US
 * microseconds (sleeping), so the requests that arrive meanwhile wait in futex(2): lock
 * contention with a known cause. The request that set it off is answered once the holder has
 * the mutex: the slow requests are the ones that waited for it (were the sleep in their own
 * thread, the slowest would be those that slept, not those that waited on the lock).
 * Prints "ready" once listening; ends by itself after SECONDS (at most 60). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t hmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hcv = PTHREAD_COND_INITIALIZER;
static int want, holding;
static unsigned long served;
static long hold_us, every;

static void *holder(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "holder");
    for (;;) {
        pthread_mutex_lock(&hmu);
        while (!want) pthread_cond_wait(&hcv, &hmu);
        want = 0;
        pthread_mutex_unlock(&hmu);
        pthread_mutex_lock(&lock);
        pthread_mutex_lock(&hmu);
        holding = 1;
        pthread_cond_broadcast(&hcv);
        pthread_mutex_unlock(&hmu);
        usleep(hold_us);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

static void *conn(void *arg) {
    int fd = (int)(long)arg;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != '\n') continue;
            pthread_mutex_lock(&lock);
            int hold = every > 0 && ++served % every == 0;
            pthread_mutex_unlock(&lock);
            if (hold) { /* the holder takes the mutex before this request is answered */
                pthread_mutex_lock(&hmu);
                holding = 0;
                want = 1;
                pthread_cond_broadcast(&hcv);
                while (!holding) pthread_cond_wait(&hcv, &hmu);
                pthread_mutex_unlock(&hmu);
            }
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
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: lockserver PORT SECONDS HOLD_US EVERY [ADDR]\n");
        return 2;
    }
    int port = atoi(argv[1]);
    long seconds = atol(argv[2]);
    hold_us = atol(argv[3]);
    every = atol(argv[4]);
    if (seconds < 1 || seconds > 60) seconds = 60;
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(0x7f000001)};
    if (argc == 6 && inet_pton(AF_INET, argv[5], &a.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", argv[5]);
        return 2;
    }
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1024)) { perror("bind"); return 1; }
    pthread_t t;
    pthread_create(&t, NULL, timer, (void *)seconds);
    pthread_create(&t, NULL, holder, NULL);
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        pthread_create(&t, NULL, conn, (void *)(long)c);
        pthread_detach(t);
    }
}
