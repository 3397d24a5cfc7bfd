/* udp_batch MODE SECONDS: UDP over loopback to itself. MODE "mmsg": sendmmsg and recvmmsg
 * with 32 datagrams per call; MODE "single": one sendto and one recvfrom per datagram.
 * About 200 rounds of 32 datagrams per second; ends by itself after SECONDS (at most 30). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 32

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int mmsg = strcmp(argv[1], "mmsg") == 0;
    double secs = atof(argv[2]);
    if (secs <= 0 || secs > 30) secs = 30;
    int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    if (bind(rx, (struct sockaddr *)&addr, sizeof addr) || getsockname(rx, (struct sockaddr *)&addr, &len)
        || connect(tx, (struct sockaddr *)&addr, sizeof addr)) {
        perror("socket setup");
        return 1;
    }
    static char bufs[BATCH][64];
    struct iovec iov[BATCH];
    struct mmsghdr msgs[BATCH];
    memset(msgs, 0, sizeof msgs);
    for (int i = 0; i < BATCH; i++) {
        iov[i].iov_base = bufs[i];
        iov[i].iov_len = sizeof bufs[i];
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    double end = now() + secs;
    printf("ready\n");
    fflush(stdout);
    while (now() < end) {
        if (mmsg) {
            for (int i = 0; i < BATCH; i++) iov[i].iov_len = 32;
            if (sendmmsg(tx, msgs, BATCH, 0) != BATCH) { perror("sendmmsg"); return 1; }
            for (int i = 0; i < BATCH; i++) iov[i].iov_len = sizeof bufs[i];
            int got = 0;
            while (got < BATCH) {
                int n = recvmmsg(rx, msgs, BATCH, 0, NULL);
                if (n < 0) { perror("recvmmsg"); return 1; }
                got += n;
            }
        } else {
            for (int i = 0; i < BATCH; i++)
                if (sendto(tx, bufs[i], 32, 0, NULL, 0) != 32) { perror("sendto"); return 1; }
            for (int i = 0; i < BATCH; i++)
                if (recvfrom(rx, bufs[i], sizeof bufs[i], 0, NULL, NULL) < 0) { perror("recvfrom"); return 1; }
        }
        usleep(5000);
    }
    return 0;
}
