/* chainserver MODE PORT SECONDS SERVE_CPU HELPER_CPU [P1 [P2]] [PATH]: a TCP server on
 * 127.0.0.1:PORT answering each line with "ok\n", whose slow requests wait for another
 * thread: a chain of blame with a known shape (diagnose's chain scenarios). The serving
 * threads run on SERVE_CPU, the thread they wait for on HELPER_CPU (a test puts its
 * interfering job there). Threads are named (their comm) for what they do. Modes:
 *
 *   lock HOLD_US PERIOD_US  a thread per connection ("handler") takes one global mutex per
 *                           request; a "holder" thread takes it about every PERIOD_US (a
 *                           random pause: in no fixed phase with other periodic work) and
 *                           spins HOLD_US while holding it: preempted then, every handler waits
 *   epoll WORK_US           one event loop ("loop", epoll) reads every connection and hands
 *                           each request to a "worker" (a condition variable), which spins
 *                           WORK_US and wakes the loop through an eventfd; the loop waits for
 *                           it in poll(2), then replies
 *   fifo EVERY PATH         handlers; every EVERY-th request needs a fresh record from the
 *                           FIFO at PATH: its handler asks the "reader" thread and waits (a
 *                           condition variable); the reader drains the FIFO, then blocks in
 *                           read(2) for the next record its writer (another process) sends
 *   idle PARK_S             handlers and nothing else, plus an "idle" thread parked on a
 *                           condition variable nobody signals, waking every PARK_S seconds
 *                           (a housekeeping thread: each wait ends inside a diagnose window)
 *
 * Prints "ready" once listening; ends by itself after SECONDS (at most 60). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ask = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
static long p1, p2;
static int serve_cpu, helper_cpu, fifo_fd = -1, efd = -1;
static unsigned long served, asked, answered;
static const char *mode;

static void pin(int cpu, const char *name) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
    pthread_setname_np(pthread_self(), name);
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void spin_us(long us) {
    int64_t end = now_ns() + us * 1000;
    while (now_ns() < end) {
    }
}

static void *holder(void *arg) {
    (void)arg;
    pin(helper_cpu, "holder");
    unsigned seed = 45;
    long pause = p2 > p1 ? p2 - p1 : 1;
    for (;;) {
        pthread_mutex_lock(&lock);
        spin_us(p1);
        pthread_mutex_unlock(&lock);
        usleep((useconds_t)(pause / 4 + rand_r(&seed) % (2 * pause)));  /* mean 1.25 pause */
    }
    return NULL;
}

/* the reader: each ask is one fresh record from the FIFO */
static void *reader(void *arg) {
    (void)arg;
    pin(helper_cpu, "reader");
    char buf[65536];
    for (;;) {
        pthread_mutex_lock(&mu);
        while (asked == answered) pthread_cond_wait(&ask, &mu);
        pthread_mutex_unlock(&mu);
        int fl = fcntl(fifo_fd, F_GETFL);
        fcntl(fifo_fd, F_SETFL, fl | O_NONBLOCK);
        while (read(fifo_fd, buf, sizeof buf) > 0) {
        }
        fcntl(fifo_fd, F_SETFL, fl & ~O_NONBLOCK);
        if (read(fifo_fd, buf, 2) <= 0) exit(1); /* the writer went away */
        pthread_mutex_lock(&mu);
        answered++;
        pthread_cond_broadcast(&done);
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

static pthread_cond_t never = PTHREAD_COND_INITIALIZER;

static void *idle(void *arg) {
    (void)arg;
    pin(helper_cpu, "idle");
    for (;;) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_sec += p1;
        pthread_mutex_lock(&mu);
        pthread_cond_timedwait(&never, &mu, &t);
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

static void serve_one(void) {
    if (!strcmp(mode, "lock")) {
        pthread_mutex_lock(&lock);
        served++;
        pthread_mutex_unlock(&lock);
    } else if (!strcmp(mode, "fifo")) {
        pthread_mutex_lock(&mu);
        if (++served % (unsigned long)p1 == 0) {
            unsigned long mine = ++asked;
            pthread_cond_signal(&ask);
            while (answered < mine) pthread_cond_wait(&done, &mu);
        }
        pthread_mutex_unlock(&mu);
    }
}

static void *handler(void *arg) {
    int fd = (int)(long)arg;
    pthread_setname_np(pthread_self(), "handler");
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != '\n') continue;
            serve_one();
            if (write(fd, "ok\n", 3) != 3) goto out;
        }
    }
out:
    close(fd);
    return NULL;
}

/* the epoll mode's worker: one job at a time, handed over by the loop */
static unsigned long jobs, finished;

static void *worker(void *arg) {
    (void)arg;
    pin(helper_cpu, "worker");
    for (;;) {
        pthread_mutex_lock(&mu);
        while (jobs == finished) pthread_cond_wait(&ask, &mu);
        pthread_mutex_unlock(&mu);
        spin_us(p1);
        pthread_mutex_lock(&mu);
        finished++;
        pthread_mutex_unlock(&mu);
        uint64_t one = 1;
        if (write(efd, &one, sizeof one) != sizeof one) exit(1);
    }
    return NULL;
}

static void event_loop(int s) {
    pthread_setname_np(pthread_self(), "loop");
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN, .data.fd = s};
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
    struct epoll_event ready[64];
    char buf[4096];
    for (;;) {
        int n = epoll_wait(ep, ready, 64, -1);
        for (int k = 0; k < n; k++) {
            int fd = ready[k].data.fd;
            if (fd == s) {
                int c = accept(s, NULL, NULL);
                if (c < 0) continue;
                struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                continue;
            }
            ssize_t got = read(fd, buf, sizeof buf);
            if (got <= 0) {
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                close(fd);
                continue;
            }
            for (ssize_t i = 0; i < got; i++) {
                if (buf[i] != '\n') continue;
                pthread_mutex_lock(&mu);
                jobs++;
                pthread_cond_signal(&ask);
                pthread_mutex_unlock(&mu);
                struct pollfd p = {.fd = efd, .events = POLLIN};
                while (poll(&p, 1, -1) < 0 && errno == EINTR) {
                }
                uint64_t v;
                if (read(efd, &v, sizeof v) != sizeof v) exit(1);
                if (write(fd, "ok\n", 3) != 3) break;
            }
        }
    }
}

static void *timer(void *arg) {
    sleep((unsigned)(long)arg);
    exit(0);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: chainserver lock|epoll|fifo|idle PORT SECONDS SERVE_CPU "
                        "HELPER_CPU [P1 [P2]] [PATH]\n");
        return 2;
    }
    mode = argv[1];
    int port = atoi(argv[2]);
    long seconds = atol(argv[3]);
    serve_cpu = atoi(argv[4]);
    helper_cpu = atoi(argv[5]);
    p1 = argc > 6 ? atol(argv[6]) : 0;
    p2 = argc > 7 ? atol(argv[7]) : 0;
    if (seconds < 1 || seconds > 60) seconds = 60;
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1024)) { perror("bind"); return 1; }
    pthread_t t;
    pthread_create(&t, NULL, timer, (void *)seconds);
    pin(serve_cpu, "acceptor");
    if (!strcmp(mode, "lock")) {
        if (p1 <= 0 || p2 <= 0) { fprintf(stderr, "lock HOLD_US PERIOD_US\n"); return 2; }
        pthread_create(&t, NULL, holder, NULL);
    } else if (!strcmp(mode, "epoll")) {
        efd = eventfd(0, 0);
        pthread_create(&t, NULL, worker, NULL);
    } else if (!strcmp(mode, "fifo")) {
        if (p1 <= 0 || argc != 8) { fprintf(stderr, "fifo EVERY PATH\n"); return 2; }
        fifo_fd = open(argv[7], O_RDONLY);
        if (fifo_fd < 0) { perror(argv[7]); return 1; }
        pthread_create(&t, NULL, reader, NULL);
    } else if (!strcmp(mode, "idle")) {
        if (p1 <= 0) { fprintf(stderr, "idle PARK_S\n"); return 2; }
        pthread_create(&t, NULL, idle, NULL);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    printf("ready\n");
    fflush(stdout);
    if (!strcmp(mode, "epoll")) event_loop(s);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        pthread_create(&t, NULL, handler, (void *)(long)c);
        pthread_detach(t);
    }
}
