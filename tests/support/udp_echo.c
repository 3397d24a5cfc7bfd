/* A UDP echo server for the tests and benchmark of `tailgate bench udp://`.
 * usage: udp_echo ADDR PORT SECONDS [drop=N] [swap=N] [dup=N] [sink]
 *   echoes every datagram to its sender with recvmmsg/sendmmsg (batches of up to 64);
 *   drop=N: drops the N-th, 2N-th, ... datagram it receives (N-1, 2N-1, ... counting from 0);
 *   swap=N: sends the datagrams counted 0, N, 2N, ... after the one that follows them;
 *   dup=N:  sends the datagrams counted N-1, 2N-1, ... twice;
 *   sink:   echoes nothing (counts only).
 * Prints "ready PORT" once bound (PORT 0 picks one), runs SECONDS or until SIGTERM, then
 * prints "received R echoed E". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define B 64
#define MAXLEN 65536

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s ADDR PORT SECONDS [drop=N] [swap=N] [dup=N] [sink]\n", argv[0]);
        return 2;
    }
    long drop = 0, swap = 0, dup = 0;
    int sink = 0;
    for (int i = 4; i < argc; i++) {
        if (!strncmp(argv[i], "drop=", 5)) drop = atol(argv[i] + 5);
        else if (!strncmp(argv[i], "swap=", 5)) swap = atol(argv[i] + 5);
        else if (!strncmp(argv[i], "dup=", 4)) dup = atol(argv[i] + 4);
        else if (!strcmp(argv[i], "sink")) sink = 1;
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2]))};
    if (fd < 0 || inet_pton(AF_INET, argv[1], &a.sin_addr) != 1 ||
        bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("bind");
        return 1;
    }
    int big = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    printf("ready %d\n", ntohs(a.sin_port));
    fflush(stdout);
    struct timeval tv = {0, 100000}; /* wake to look at the clock and the stop flag */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    static char bufs[B][MAXLEN];
    static char out[2 * B + 1][MAXLEN];
    struct sockaddr_in names[B], onames[2 * B + 1];
    struct mmsghdr in[B], o[2 * B + 1];
    struct iovec iov[B], oiov[2 * B + 1];
    char held[MAXLEN];
    size_t held_len = 0;
    struct sockaddr_in held_name;
    int holding = 0;
    unsigned long long received = 0, echoed = 0;
    time_t end = time(NULL) + atol(argv[3]);
    while (!stop && time(NULL) < end) {
        for (int j = 0; j < B; j++) {
            iov[j].iov_base = bufs[j];
            iov[j].iov_len = MAXLEN;
            memset(&in[j].msg_hdr, 0, sizeof in[j].msg_hdr);
            in[j].msg_hdr.msg_iov = &iov[j];
            in[j].msg_hdr.msg_iovlen = 1;
            in[j].msg_hdr.msg_name = &names[j];
            in[j].msg_hdr.msg_namelen = sizeof names[j];
        }
        int n = recvmmsg(fd, in, B, MSG_WAITFORONE, NULL);
        if (n <= 0) continue;
        int k = 0;
#define OUT(buf, len, name)                                              \
    do {                                                                 \
        memcpy(out[k], buf, len);                                        \
        onames[k] = name;                                                \
        oiov[k].iov_base = out[k];                                       \
        oiov[k].iov_len = len;                                           \
        memset(&o[k].msg_hdr, 0, sizeof o[k].msg_hdr);                   \
        o[k].msg_hdr.msg_iov = &oiov[k];                                 \
        o[k].msg_hdr.msg_iovlen = 1;                                     \
        o[k].msg_hdr.msg_name = &onames[k];                              \
        o[k].msg_hdr.msg_namelen = sizeof onames[k];                     \
        k++;                                                             \
    } while (0)
        for (int j = 0; j < n; j++) {
            unsigned long long c = received++;
            size_t len = in[j].msg_len;
            if (sink) continue;
            if (drop && c % drop == (unsigned long long)drop - 1) continue;
            if (swap && c % swap == 0 && !holding) {
                memcpy(held, bufs[j], len);
                held_len = len;
                held_name = names[j];
                holding = 1;
                continue;
            }
            OUT(bufs[j], len, names[j]);
            if (dup && c % dup == (unsigned long long)dup - 1) OUT(bufs[j], len, names[j]);
            if (holding) {
                OUT(held, held_len, held_name);
                holding = 0;
            }
        }
        int off = 0;
        while (off < k) {
            int s = sendmmsg(fd, o + off, (unsigned)(k - off), 0);
            if (s < 0) {
                if (errno == EINTR) continue;
                break; /* the client is gone: drop the rest */
            }
            off += s;
        }
        echoed += (unsigned long long)off;
    }
    printf("received %llu echoed %llu\n", received, echoed);
    return 0;
}
