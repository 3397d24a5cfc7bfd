/* Holds one io_uring ring open for a bounded time so `tailgate inspect --pid` can judge it.
 * usage: uring_ring sqpoll|plain|none SECONDS
 *   sqpoll: IORING_SETUP_SQPOLL and 2 registered buffers (what l2.io.io_uring asks for)
 *   plain:  a ring with registered buffers but no SQPOLL
 *   none:   no ring at all
 * Prints "ready" once the ring exists, then sleeps. */
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s sqpoll|plain|none SECONDS\n", argv[0]); return 2; }
    int seconds = atoi(argv[2]);
    struct io_uring ring;
    static char a[4096], b[8192];
    struct iovec iov[2] = {{a, sizeof a}, {b, sizeof b}};
    if (strcmp(argv[1], "none") != 0) {
        struct io_uring_params p;
        memset(&p, 0, sizeof p);
        if (strcmp(argv[1], "sqpoll") == 0) { p.flags = IORING_SETUP_SQPOLL; p.sq_thread_idle = 2000; }
        int rc = io_uring_queue_init_params(8, &ring, &p);
        if (rc < 0) { fprintf(stderr, "io_uring_queue_init: %s\n", strerror(-rc)); return 1; }
        rc = io_uring_register_buffers(&ring, iov, 2);
        if (rc < 0) { fprintf(stderr, "register_buffers: %s\n", strerror(-rc)); return 1; }
    }
    printf("ready\n");
    fflush(stdout);
    sleep(seconds);
    return 0;
}
