/* The datagram loop of `tailgate bench udp://HOST:PORT` (tailgate.bench.udploop).
 *
 * One connected UDP socket, one thread without the GIL. Datagram i carries a 16-byte
 * header (magic, i) and is due at t0 + i * period (period 0: as fast as the path takes,
 * each datagram due when it is sent). The loop sends what is due (never waits to fill a
 * batch: the load stays open-loop), reads every echo that has arrived, and writes two
 * stamps per datagram into arrays the caller owns: send_ns[i], the clock just before the
 * syscall that sent it, and recv_ns[i], the clock just after the call that read its echo
 * (0: no echo; -errno: the kernel refused the send). Python turns them into latency from
 * the intended start, service time, lateness and loss (bench/udp.py).
 *
 * Three ways to the kernel, the method's cures for the syscall tax:
 *   MODE_SYSCALL, batch 1: send(2) and recv(2), one datagram a call;
 *   MODE_SYSCALL, batch B: sendmmsg(2) and recvmmsg(2), up to B datagrams a call;
 *   MODE_URING: io_uring by raw syscalls (<linux/io_uring.h> only, so a fresh Debian 12
 *     with libc6-dev builds it; no liburing): up to B sends per io_uring_enter, a
 *     registered socket, and one multishot receive filling a registered ring of
 *     provided buffers (kernel >= 6.0; older kernels: the call says why).
 *
 * Echoes: a datagram whose magic or length is wrong, or whose index is out of range, is
 * `malformed`; a second echo of one index `duplicate`; an echo of an index lower than one
 * already echoed `reordered` (it arrived after a later datagram). Nothing is dropped
 * silently: every scheduled datagram ends echoed, refused, or without an echo. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <linux/io_uring.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x7461696c67617465ULL /* "tailgate" */
#define HDR 16
#define MAX_BATCH 1024
#define SPIN_NS 20000 /* poll instead of sleeping this close to a due time */
#define MODE_SYSCALL 0
#define MODE_URING 1

static atomic_int g_stop;

typedef struct {
    int fd;
    size_t size;
    int batch;
    uint64_t n;          /* datagrams the arrays hold (the schedule's length) */
    int64_t period_ns;   /* 0: as fast as the path takes */
    int64_t deadline_ns; /* no send at or after this (absolute; 0: none) */
    int64_t timeout_ns;  /* wait this long after the last send for its echo */
    int64_t *send_ns, *recv_ns;
    int64_t t0;
    /* counters */
    uint64_t next, echoed, duplicate, reordered, malformed, refused, send_calls, recv_calls,
        waits, max_seen, icmp_errors;
    int have_seen;
    int64_t last_send;
    char *rbuf; /* batch * size receive buffers (syscall mode) */
    char *sbuf; /* batch * size send buffers */
    char err[256];
} run_t;

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t due_at(const run_t *r, uint64_t i) {
    return r->t0 + (int64_t)i * r->period_ns;
}

static inline void stamp(char *buf, uint64_t seq) {
    uint64_t m = MAGIC;
    memcpy(buf, &m, 8);
    memcpy(buf + 8, &seq, 8);
}

/* One echo read at `t`. */
static inline void take(run_t *r, const char *buf, ssize_t len, int64_t t) {
    uint64_t m, seq;
    if (len != (ssize_t)r->size) { r->malformed++; return; }
    memcpy(&m, buf, 8);
    memcpy(&seq, buf + 8, 8);
    if (m != MAGIC || seq >= r->next) { r->malformed++; return; }
    if (r->recv_ns[seq] != 0) { r->duplicate++; return; }
    r->recv_ns[seq] = t;
    r->echoed++;
    if (r->have_seen && seq < r->max_seen) r->reordered++;
    else { r->max_seen = seq; r->have_seen = 1; }
}

/* How many datagrams are due now (at most `cap`); 0 once the schedule or deadline ends. */
static inline uint64_t due_count(run_t *r, int64_t t, uint64_t cap) {
    if (r->next >= r->n || (r->deadline_ns && t >= r->deadline_ns)) return 0;
    uint64_t left = r->n - r->next;
    if (r->period_ns == 0) return left < cap ? left : cap;
    if (t < due_at(r, r->next)) return 0;
    uint64_t upto = (uint64_t)((t - r->t0) / r->period_ns) + 1; /* due: indices < upto */
    if (upto > r->n) upto = r->n;
    uint64_t k = upto - r->next;
    return k < cap ? k : cap;
}

static int sending_done(const run_t *r, int64_t t) {
    return r->next >= r->n || (r->deadline_ns && t >= r->deadline_ns);
}

/* The time to wake for: the next due datagram, else the end of the echo wait. */
static int64_t wake_at(const run_t *r, int64_t t) {
    if (!sending_done(r, t) && r->period_ns) return due_at(r, r->next);
    if (!sending_done(r, t)) return t; /* max rate: never sleep while sending */
    return r->last_send + r->timeout_ns;
}

static int finished(const run_t *r, int64_t t) {
    if (!sending_done(r, t)) return 0;
    if (r->echoed + r->refused >= r->next) return 1;
    return t >= r->last_send + r->timeout_ns;
}

/* ---------------------------------------------------------------- send(2)/sendmmsg(2) */

static int sys_send(run_t *r, uint64_t k, int64_t t, int *blocked) {
    *blocked = 0;
    if (r->batch == 1) {
        for (uint64_t j = 0; j < k; j++) {
            uint64_t seq = r->next;
            stamp(r->sbuf, seq);
            int64_t ts = j ? now_ns() : t;
            r->send_calls++;
            ssize_t rc = send(r->fd, r->sbuf, r->size, MSG_DONTWAIT);
            if (rc < 0) {
                if (errno == EAGAIN || errno == ENOBUFS) { *blocked = 1; return 0; }
                if (errno == EINTR) continue;
                r->send_ns[seq] = ts;
                r->recv_ns[seq] = -errno;
                r->refused++;
            } else {
                r->send_ns[seq] = ts;
            }
            r->next++;
            r->last_send = ts;
        }
        return 0;
    }
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    for (uint64_t j = 0; j < k; j++) {
        stamp(r->sbuf + j * r->size, r->next + j);
        iov[j].iov_base = r->sbuf + j * r->size;
        iov[j].iov_len = r->size;
        memset(&msgs[j].msg_hdr, 0, sizeof msgs[j].msg_hdr);
        msgs[j].msg_hdr.msg_iov = &iov[j];
        msgs[j].msg_hdr.msg_iovlen = 1;
    }
    uint64_t off = 0;
    while (off < k) {
        r->send_calls++;
        int rc = sendmmsg(r->fd, msgs + off, (unsigned)(k - off), MSG_DONTWAIT);
        if (rc < 0) {
            if (errno == EAGAIN || errno == ENOBUFS) { *blocked = 1; return 0; }
            if (errno == EINTR) continue;
            /* the first datagram of the call was refused (ICMP unreachable, ...) */
            uint64_t seq = r->next;
            r->send_ns[seq] = t;
            r->recv_ns[seq] = -errno;
            r->refused++;
            r->next++;
            r->last_send = t;
            off++;
            continue;
        }
        for (int j = 0; j < rc; j++) r->send_ns[r->next + j] = t;
        r->next += (uint64_t)rc;
        r->last_send = t;
        off += (uint64_t)rc;
        t = now_ns();
    }
    return 0;
}

static void sys_recv(run_t *r) {
    int rounds = 64; /* then let sends due meanwhile go first */
    if (r->batch == 1) {
        while (rounds--) {
            r->recv_calls++;
            ssize_t rc = recv(r->fd, r->rbuf, r->size + 1, MSG_DONTWAIT);
            int64_t t = now_ns();
            if (rc < 0) {
                /* an ICMP error (port unreachable, ...) read here, not by a send: counted */
                if (errno != EAGAIN && errno != EINTR) { r->icmp_errors++; continue; }
                return;
            }
            take(r, r->rbuf, rc, t);
        }
        return;
    }
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    for (int j = 0; j < r->batch; j++) {
        iov[j].iov_base = r->rbuf + (size_t)j * (r->size + 1);
        iov[j].iov_len = r->size + 1;
        memset(&msgs[j].msg_hdr, 0, sizeof msgs[j].msg_hdr);
        msgs[j].msg_hdr.msg_iov = &iov[j];
        msgs[j].msg_hdr.msg_iovlen = 1;
    }
    while (rounds--) {
        r->recv_calls++;
        int rc = recvmmsg(r->fd, msgs, (unsigned)r->batch, MSG_DONTWAIT, NULL);
        int64_t t = now_ns();
        if (rc < 0) {
            if (errno != EAGAIN && errno != EINTR) { r->icmp_errors++; continue; }
            return;
        }
        for (int j = 0; j < rc; j++) {
            ssize_t len = msgs[j].msg_hdr.msg_flags & MSG_TRUNC ? -1 : (ssize_t)msgs[j].msg_len;
            take(r, iov[j].iov_base, len, t);
        }
        if (rc < r->batch) return;
    }
}

static int run_syscalls(run_t *r) {
    int blocked = 0;
    for (;;) {
        if (atomic_load_explicit(&g_stop, memory_order_relaxed)) return 0;
        int64_t t = now_ns();
        /* one call's worth of sends, then the echoes: a sender that never blocks (UDP over
         * veth frees each datagram at once) must not starve its own receive queue */
        uint64_t k = due_count(r, t, (uint64_t)r->batch);
        if (k) sys_send(r, k, t, &blocked);
        sys_recv(r);
        t = now_ns();
        if (finished(r, t)) return 0;
        int64_t wake = wake_at(r, t);
        if (!blocked && wake - t < SPIN_NS) continue;
        struct pollfd p = {r->fd, POLLIN | (blocked ? POLLOUT : 0), 0};
        int64_t d = wake - t;
        if (blocked && d > 1000000) d = 1000000;
        if (d < 0) d = 0;
        if (!blocked) d -= SPIN_NS / 2; /* wake a little early, then poll to the due time */
        struct timespec ts = {d / 1000000000LL, d % 1000000000LL};
        r->waits++;
        ppoll(&p, 1, &ts, NULL);
        blocked = 0; /* writable, an echo, or time is up: try the send again */
    }
}

/* ------------------------------------------------------------------- io_uring (raw) */

typedef struct {
    int fd;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_ring, *cq_ring;
    size_t sq_len, cq_len, sqes_len;
    unsigned sq_entries, to_submit, tail; /* tail: the next SQE to fill (ours) */
    struct io_uring_buf_ring *br;
    size_t br_len;
    unsigned br_entries;
    char *bufs;
    size_t buf_size;
} uring_t;

#define TAG_RECV (1ULL << 63)
#define NBUF 4096

static int sys_setup(unsigned entries, struct io_uring_params *p) {
    return (int)syscall(__NR_io_uring_setup, entries, p);
}
static int sys_enter(int fd, unsigned submit, unsigned wait, unsigned flags, void *arg, size_t sz) {
    return (int)syscall(__NR_io_uring_enter, fd, submit, wait, flags, arg, sz);
}
static int sys_register(int fd, unsigned op, void *arg, unsigned n) {
    return (int)syscall(__NR_io_uring_register, fd, op, arg, n);
}

static void ring_close(uring_t *u) {
    if (u->sqes) munmap(u->sqes, u->sqes_len);
    if (u->cq_ring && u->cq_ring != u->sq_ring) munmap(u->cq_ring, u->cq_len);
    if (u->sq_ring) munmap(u->sq_ring, u->sq_len);
    if (u->br) munmap(u->br, u->br_len);
    free(u->bufs);
    if (u->fd >= 0) close(u->fd);
}

static int ring_open(uring_t *u, run_t *r) {
    memset(u, 0, sizeof *u);
    u->fd = -1;
    struct io_uring_params p;
    unsigned entries = 64;
    while (entries < (unsigned)r->batch * 2) entries <<= 1;
    /* one task submits and reaps: completions run when it asks (6.1+), else plain */
    unsigned tries[] = {IORING_SETUP_CQSIZE | IORING_SETUP_SINGLE_ISSUER |
                        IORING_SETUP_DEFER_TASKRUN, IORING_SETUP_CQSIZE};
    for (int i = 0; i < 2 && u->fd < 0; i++) {
        memset(&p, 0, sizeof p);
        p.flags = tries[i];
        p.cq_entries = NBUF * 2;
        u->fd = sys_setup(entries, &p);
    }
    if (u->fd < 0) {
        snprintf(r->err, sizeof r->err, "io_uring_setup: %s", strerror(errno));
        return -1;
    }
    if (!(p.features & IORING_FEAT_EXT_ARG)) {
        snprintf(r->err, sizeof r->err, "io_uring: the kernel lacks IORING_FEAT_EXT_ARG (5.11+)");
        return -1;
    }
    u->sq_entries = p.sq_entries;
    u->sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    u->cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        if (u->cq_len > u->sq_len) u->sq_len = u->cq_len;
        u->cq_len = u->sq_len;
    }
    u->sq_ring = mmap(0, u->sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
                      IORING_OFF_SQ_RING);
    if (u->sq_ring == MAP_FAILED) { u->sq_ring = 0; goto fail; }
    if (p.features & IORING_FEAT_SINGLE_MMAP) u->cq_ring = u->sq_ring;
    else {
        u->cq_ring = mmap(0, u->cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
                          IORING_OFF_CQ_RING);
        if (u->cq_ring == MAP_FAILED) { u->cq_ring = 0; goto fail; }
    }
    u->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    u->sqes = mmap(0, u->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
                   IORING_OFF_SQES);
    if (u->sqes == MAP_FAILED) { u->sqes = 0; goto fail; }
    char *sq = u->sq_ring, *cq = u->cq_ring;
    u->sq_head = (unsigned *)(sq + p.sq_off.head);
    u->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    u->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    u->sq_array = (unsigned *)(sq + p.sq_off.array);
    u->cq_head = (unsigned *)(cq + p.cq_off.head);
    u->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    u->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    u->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    u->tail = *u->sq_tail;
    /* the socket, registered: no file lookup per operation */
    if (sys_register(u->fd, IORING_REGISTER_FILES, &r->fd, 1) < 0) {
        snprintf(r->err, sizeof r->err, "io_uring_register(FILES): %s", strerror(errno));
        return -1;
    }
    /* the receive buffers, registered as a ring of provided buffers (5.19+) */
    u->br_entries = NBUF;
    u->br_len = (size_t)NBUF * sizeof(struct io_uring_buf);
    u->br = mmap(0, u->br_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (u->br == MAP_FAILED) { u->br = 0; goto fail; }
    u->buf_size = r->size + 1; /* one byte more: a longer echo shows as malformed */
    u->bufs = malloc(u->buf_size * NBUF);
    if (!u->bufs) goto fail;
    struct io_uring_buf_reg reg;
    memset(&reg, 0, sizeof reg);
    reg.ring_addr = (uint64_t)(uintptr_t)u->br;
    reg.ring_entries = NBUF;
    reg.bgid = 0;
    if (sys_register(u->fd, IORING_REGISTER_PBUF_RING, &reg, 1) < 0) {
        snprintf(r->err, sizeof r->err, "io_uring_register(PBUF_RING, kernel 5.19+): %s",
                 strerror(errno));
        return -1;
    }
    for (unsigned i = 0; i < NBUF; i++) {
        struct io_uring_buf *b = &u->br->bufs[i];
        b->addr = (uint64_t)(uintptr_t)(u->bufs + (size_t)i * u->buf_size);
        b->len = (unsigned)u->buf_size;
        b->bid = (unsigned short)i;
    }
    atomic_store_explicit((_Atomic unsigned short *)&u->br->tail, (unsigned short)NBUF,
                          memory_order_release);
    return 0;
fail:
    snprintf(r->err, sizeof r->err, "io_uring ring set-up: %s", strerror(errno));
    return -1;
}

static struct io_uring_sqe *sqe_get(uring_t *u) {
    unsigned head = atomic_load_explicit((_Atomic unsigned *)u->sq_head, memory_order_acquire);
    if (u->tail - head >= u->sq_entries) return NULL;
    unsigned idx = u->tail & *u->sq_mask;
    u->sq_array[idx] = idx;
    u->tail++;
    u->to_submit++;
    struct io_uring_sqe *s = &u->sqes[idx];
    memset(s, 0, sizeof *s);
    return s;
}

static void sqe_publish(uring_t *u) {
    atomic_store_explicit((_Atomic unsigned *)u->sq_tail, u->tail, memory_order_release);
}

static int arm_recv(uring_t *u) {
    struct io_uring_sqe *s = sqe_get(u);
    if (!s) return -1;
    s->opcode = IORING_OP_RECV;
    s->fd = 0; /* the registered socket */
    s->flags = IOSQE_FIXED_FILE | IOSQE_BUFFER_SELECT;
    s->ioprio = IORING_RECV_MULTISHOT;
    s->buf_group = 0;
    s->user_data = TAG_RECV;
    return 0;
}

static inline void buf_return(uring_t *u, unsigned short bid) {
    unsigned short tail = u->br->tail;
    struct io_uring_buf *b = &u->br->bufs[tail & (NBUF - 1)];
    b->addr = (uint64_t)(uintptr_t)(u->bufs + (size_t)bid * u->buf_size);
    b->len = (unsigned)u->buf_size;
    b->bid = bid;
    atomic_store_explicit((_Atomic unsigned short *)&u->br->tail, (unsigned short)(tail + 1),
                          memory_order_release);
}

static int run_uring(run_t *r) {
    uring_t u;
    if (ring_open(&u, r) < 0) { ring_close(&u); return -1; }
    /* send slots: a datagram's bytes stay put until its completion */
    unsigned nslot = u.sq_entries;
    char *slots = malloc((size_t)nslot * r->size);
    uint64_t *slot_seq = malloc(nslot * sizeof(uint64_t));
    unsigned *free_slots = malloc(nslot * sizeof(unsigned));
    if (!slots || !slot_seq || !free_slots) {
        snprintf(r->err, sizeof r->err, "out of memory");
        free(slots); free(slot_seq); free(free_slots); ring_close(&u);
        return -1;
    }
    unsigned nfree = nslot;
    for (unsigned i = 0; i < nslot; i++) free_slots[i] = nslot - 1 - i;
    int rearm = 1, rc = 0;
    for (;;) {
        if (atomic_load_explicit(&g_stop, memory_order_relaxed)) break;
        if (rearm && arm_recv(&u) == 0) rearm = 0;
        int64_t t = now_ns();
        uint64_t cap = (uint64_t)r->batch < nfree ? (uint64_t)r->batch : nfree;
        uint64_t k = due_count(r, t, cap);
        for (uint64_t j = 0; j < k; j++) {
            struct io_uring_sqe *s = sqe_get(&u);
            if (!s) break;
            unsigned slot = free_slots[--nfree];
            uint64_t seq = r->next++;
            char *buf = slots + (size_t)slot * r->size;
            stamp(buf, seq);
            slot_seq[slot] = seq;
            r->send_ns[seq] = t;
            r->last_send = t;
            s->opcode = IORING_OP_SEND;
            s->fd = 0;
            s->flags = IOSQE_FIXED_FILE;
            s->addr = (uint64_t)(uintptr_t)buf;
            s->len = (unsigned)r->size;
            s->user_data = slot;
        }
        sqe_publish(&u);
        unsigned submit = u.to_submit;
        int64_t wake = wake_at(r, t);
        int64_t d = wake - t;
        int busy = (r->period_ns == 0 && !sending_done(r, t) && nfree) || d < SPIN_NS;
        struct io_uring_getevents_arg arg;
        struct __kernel_timespec ts;
        memset(&arg, 0, sizeof arg);
        if (!busy) {
            d -= SPIN_NS / 2;
            if (!nfree && d > 1000000) d = 1000000;
            ts.tv_sec = d / 1000000000LL;
            ts.tv_nsec = d % 1000000000LL;
            arg.ts = (uint64_t)(uintptr_t)&ts;
            r->waits++;
        }
        if (submit) r->send_calls++;
        else r->recv_calls++;
        int e = sys_enter(u.fd, submit, busy ? 0 : 1,
                          IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG, &arg, sizeof arg);
        /* the SQEs consumed come off to_submit; EAGAIN/EBUSY: none was, they wait for the
         * next call; ETIME/EINTR: the wait ended (nothing was left to submit) */
        if (e >= 0) u.to_submit -= (unsigned)e < submit ? (unsigned)e : submit;
        else if (errno != ETIME && errno != EINTR && errno != EAGAIN && errno != EBUSY) {
            snprintf(r->err, sizeof r->err, "io_uring_enter: %s", strerror(errno));
            rc = -1;
            break;
        }
        /* completions */
        int64_t tc = now_ns();
        unsigned head = *u.cq_head;
        unsigned tail = atomic_load_explicit((_Atomic unsigned *)u.cq_tail, memory_order_acquire);
        for (; head != tail; head++) {
            struct io_uring_cqe *c = &u.cqes[head & *u.cq_mask];
            if (c->user_data == TAG_RECV) {
                if (!(c->flags & IORING_CQE_F_MORE)) rearm = 1;
                if (c->res >= 0 && (c->flags & IORING_CQE_F_BUFFER)) {
                    unsigned short bid = (unsigned short)(c->flags >> IORING_CQE_BUFFER_SHIFT);
                    ssize_t len = c->res > (int)r->size ? -1 : c->res;
                    take(r, u.bufs + (size_t)bid * u.buf_size, len, tc);
                    buf_return(&u, bid);
                }
                else if (c->res < 0 && c->res != -ENOBUFS) r->icmp_errors++;
                /* -ENOBUFS: every buffer held; they were returned above, rearm */
            } else {
                unsigned slot = (unsigned)c->user_data;
                if (c->res < 0) {
                    uint64_t seq = slot_seq[slot];
                    r->recv_ns[seq] = c->res; /* -errno */
                    r->refused++;
                }
                free_slots[nfree++] = slot;
            }
        }
        atomic_store_explicit((_Atomic unsigned *)u.cq_head, head, memory_order_release);
        if (finished(r, now_ns()) && nfree == nslot) break;
    }
    free(slots); free(slot_seq); free(free_slots);
    ring_close(&u);
    return rc;
}

/* ---------------------------------------------------------------------- Python API */

static int wbuf(PyObject *o, Py_buffer *v, uint64_t n, const char *name) {
    if (PyObject_GetBuffer(o, v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if ((uint64_t)v->len < n * sizeof(int64_t)) {
        PyBuffer_Release(v);
        PyErr_Format(PyExc_ValueError, "%s holds fewer than n int64 values", name);
        return -1;
    }
    return 0;
}

static PyObject *py_run(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"fd", "size", "batch", "mode", "n", "period_ns", "duration_ns",
                            "timeout_ns", "send_ns", "recv_ns", "start_ns", NULL};
    int fd, batch, mode;
    Py_ssize_t size;
    unsigned long long n;
    long long period, duration, timeout, start;
    PyObject *so, *ro;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "inii" "KLLL" "OOL", names, &fd, &size, &batch,
                                     &mode, &n, &period, &duration, &timeout, &so, &ro, &start))
        return NULL;
    if (size < HDR || size > 65507 || batch < 1 || batch > MAX_BATCH || period < 0 ||
        timeout <= 0 || (mode != MODE_SYSCALL && mode != MODE_URING)) {
        PyErr_SetString(PyExc_ValueError, "size 16..65507, batch 1..1024, mode 0|1, "
                                          "timeout > 0, period >= 0");
        return NULL;
    }
    Py_buffer sv, rv;
    if (wbuf(so, &sv, n, "send_ns") < 0) return NULL;
    if (wbuf(ro, &rv, n, "recv_ns") < 0) { PyBuffer_Release(&sv); return NULL; }
    run_t r;
    memset(&r, 0, sizeof r);
    r.fd = fd;
    r.size = (size_t)size;
    r.batch = batch;
    r.n = n;
    r.period_ns = period;
    r.timeout_ns = timeout;
    r.send_ns = sv.buf;
    r.recv_ns = rv.buf;
    r.sbuf = malloc((size_t)batch * r.size);
    r.rbuf = malloc((size_t)batch * (r.size + 1));
    int rc = -1;
    struct rusage u0, u1;
    if (r.sbuf && r.rbuf) {
        memset(r.sbuf, 0, (size_t)batch * r.size);
        Py_BEGIN_ALLOW_THREADS
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* ns-exact ppoll time-outs in this thread */
        getrusage(RUSAGE_THREAD, &u0);
        r.t0 = start; /* the first datagram's due time (CLOCK_MONOTONIC, the caller's) */
        r.deadline_ns = duration > 0 ? r.t0 + duration : 0;
        r.last_send = r.t0;
        rc = mode == MODE_URING ? run_uring(&r) : run_syscalls(&r);
        getrusage(RUSAGE_THREAD, &u1);
        Py_END_ALLOW_THREADS
    } else {
        snprintf(r.err, sizeof r.err, "out of memory");
    }
    free(r.sbuf);
    free(r.rbuf);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&rv);
    if (rc < 0) {
        PyErr_SetString(PyExc_OSError, r.err);
        return NULL;
    }
    double cpu = (double)(u1.ru_utime.tv_sec - u0.ru_utime.tv_sec) +
                 (double)(u1.ru_stime.tv_sec - u0.ru_stime.tv_sec) +
                 1e-6 * (double)(u1.ru_utime.tv_usec - u0.ru_utime.tv_usec +
                                 u1.ru_stime.tv_usec - u0.ru_stime.tv_usec);
    return Py_BuildValue(
        "{s:L,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:O}", "t0_ns", (long long)r.t0,
        "icmp_errors", r.icmp_errors,
        "sent", r.next, "echoed", r.echoed, "duplicate", r.duplicate, "reordered", r.reordered,
        "malformed", r.malformed, "refused", r.refused, "send_calls", r.send_calls,
        "recv_calls", r.recv_calls, "waits", r.waits, "cpu_s", cpu, "stopped",
        atomic_load(&g_stop) ? Py_True : Py_False);
}

static PyObject *py_stop(PyObject *self, PyObject *unused) {
    atomic_store(&g_stop, 1);
    Py_RETURN_NONE;
}

static PyObject *py_reset(PyObject *self, PyObject *unused) {
    atomic_store(&g_stop, 0);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))py_run, METH_VARARGS | METH_KEYWORDS,
     "run(fd, size, batch, mode, n, period_ns, duration_ns, timeout_ns, send_ns, recv_ns, "
     "start_ns) "
     "-> counters: send n datagrams on the connected UDP socket fd and stamp their echoes"},
    {"stop", py_stop, METH_NOARGS, "end a run now (from another thread)"},
    {"reset", py_reset, METH_NOARGS, "clear a stop before the next run"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "udploop",
                                    "The datagram loop of bench udp:// (see udploop.c)", -1,
                                    methods};

PyMODINIT_FUNC PyInit_udploop(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyModule_AddIntConstant(m, "HEADER", HDR);
    PyModule_AddIntConstant(m, "MAX_BATCH", MAX_BATCH);
    PyModule_AddIntConstant(m, "MODE_SYSCALL", MODE_SYSCALL);
    PyModule_AddIntConstant(m, "MODE_URING", MODE_URING);
    return m;
}
