/* slowpath PORT SECONDS MODE US EVERY: a TCP server on 127.0.0.1:PORT, one thread per
 * connection, answering each line with "ok\n" after 20 us of its own CPU time; one request in
 * EVERY (counted over all connections) first takes a slow path of US microseconds, in a
 * function of its own (the stack the profile must name):
 *   sleep  slow_sleep:     nanosleep(2)
 *   read   slow_read_file: read(2) of a file that answers after US: a FIFO that a child process
 *                          (not the service) writes a byte to US after the handler asked
 *   cpu    slow_burn:      a busy loop on the thread's CPU clock
 * Built with frame pointers (tests/support/workloads: CFLAGS). Prints "ready" once listening;
 * ends by itself after SECONDS (at most 60); the child ends with it. */
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static long slow_us, every;
static int mode;  /* 0 sleep, 1 read, 2 cpu */
static atomic_long served;
static int ask_fd = -1, answer_fd = -1;
static pthread_mutex_t file_lock = PTHREAD_MUTEX_INITIALIZER;

static long cpu_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static void sleep_us(long us) {
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = us % 1000000 * 1000};
    nanosleep(&ts, NULL);
}

__attribute__((noinline)) static void slow_sleep(void) { sleep_us(slow_us); }

/* a frame between the slow path and libc's read(): libc keeps no frame pointer, so a walk
 * by frame pointers never shows the function that called read() (the frame above read is
 * its caller's caller): here that is slow_read_file, the function the profile must name */
__attribute__((noinline)) static void read_answer(void) {
    char c = 'x';
    if (write(ask_fd, &c, 1) == 1 && read(answer_fd, &c, 1) != 1) abort();
}

__attribute__((noinline)) static void slow_read_file(void) {
    /* one request at a time on the file: each read gets its own answer */
    pthread_mutex_lock(&file_lock);
    read_answer();
    pthread_mutex_unlock(&file_lock);
}

__attribute__((noinline)) static void slow_burn(void) {
    long end = cpu_us() + slow_us;
    while (cpu_us() < end) {
    }
}

__attribute__((noinline)) static void handle(void) {
    if (every > 0 && atomic_fetch_add(&served, 1) % every == every - 1) {
        if (mode == 0) slow_sleep();
        else if (mode == 1) slow_read_file();
        else slow_burn();
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

/* the slow device: answers each byte asked for US later */
static void device(const char *ask, const char *answer) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int in = open(ask, O_RDONLY), out = open(answer, O_WRONLY);
    char c;
    if (in < 0 || out < 0) _exit(1);
    while (read(in, &c, 1) == 1) {
        sleep_us(slow_us);
        if (write(out, &c, 1) != 1) _exit(1);
    }
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc != 6) { fprintf(stderr, "usage: slowpath PORT SECONDS sleep|read|cpu US EVERY\n"); return 2; }
    int port = atoi(argv[1]);
    long seconds = atol(argv[2]);
    mode = !strcmp(argv[3], "sleep") ? 0 : !strcmp(argv[3], "read") ? 1 : !strcmp(argv[3], "cpu") ? 2 : -1;
    slow_us = atol(argv[4]);
    every = atol(argv[5]);
    if (mode < 0) { fprintf(stderr, "slowpath: MODE is sleep, read or cpu\n"); return 2; }
    if (seconds < 1 || seconds > 60) seconds = 60;
    if (slow_us < 0 || slow_us > 1000000) slow_us = 5000;
    if (mode == 1) {
        char dir[64], ask[96], answer[96];
        snprintf(dir, sizeof dir, "/tmp/slowpath-XXXXXX");
        if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
        snprintf(ask, sizeof ask, "%s/ask", dir);
        snprintf(answer, sizeof answer, "%s/answer", dir);
        if (mkfifo(ask, 0600) || mkfifo(answer, 0600)) { perror("mkfifo"); return 1; }
        if (fork() == 0) device(ask, answer);
        ask_fd = open(ask, O_WRONLY);
        answer_fd = open(answer, O_RDONLY);
        if (ask_fd < 0 || answer_fd < 0) { perror("open"); return 1; }
        /* both ends open: the names are no longer needed (nothing left behind if killed) */
        unlink(ask);
        unlink(answer);
        rmdir(dir);
    }
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
