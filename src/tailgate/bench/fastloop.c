/* The compiled hot path of tailgate bench: one open-loop load loop (see fastpath.py).
 *
 * The same rules as the Python reference engine (engine.py, http.py, http1.py, tcp.py):
 * the schedule, the FIFO queue, the pool (idle stack, MAX_CONNECTING attempts, the cap),
 * time-outs recorded at intended + timeout, the stale keep-alive retry, RFC 9112 response
 * framing with bounded buffers and the same outcome kinds and reasons. It runs in its own
 * thread without the GIL (Loop.run); the Python side takes the records completed so far
 * (Loop.take) a few times a second and does all the histogramming.
 *
 * Times inside are int64 ns on CLOCK_MONOTONIC relative to the start; a record's send
 * time is NO_TIME when the request never reached the wire. A record's arrive time is when
 * the kernel received the bytes that completed it (SO_TIMESTAMPNS): end - arrive is how
 * long the reply waited for this loop to read it (NO_TIME: not known).
 *
 * TLS (https://, openai+https://) is OpenSSL over memory BIOs: the loop reads the
 * ciphertext itself with recvmsg, so each read keeps its kernel receive time, hands it to
 * the session and frames what it decrypts with the same code as plaintext; what the
 * session writes is sent from the connection's own buffer (tls_push). A connection counts
 * as connecting until its handshake is done (tls.dial: no request goes out before).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <linux/net_tstamp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* outcome codes: bench/outcome.py */
enum { OK = 0, CONNECT, TIMEOUT, RESET, S4XX, S5XX, PROTOCOL, TRUNCATED, TOO_LARGE, UPGRADE,
       STALE, MALFORMED_SSE, SERVER_ERROR, NO_TOKEN, TLS_K };
/* error kinds that are not outcomes (http1.FramingError "closed") */
#define K_CLOSED 100

#define NO_TIME INT64_MIN
#define MAX_CONNECTING 16 /* engine.MAX_CONNECTING: the same pool rule */
#define READ_CHUNK (1 << 16)
#define MAX_REASON 200
#define MAX_REASONS 64 /* distinct (scope, kind, reason) per take(); Python keeps 5 a kind */
#define EV_WAKE UINT64_MAX
#define MAX_SUSPECTS 64 /* conn.MAX_SUSPECTS */
/* conn.OUT_OF_STEP: the reason of an ok turned protocol by a later stray response */
#define OUT_OF_STEP "out of step: a response nobody asked for came on its connection " \
    "after it, so its response may have been an earlier request's"

enum { C_FREE = 0, C_CONNECTING, C_OPEN };
/* response reader states (http1.py) */
enum { IDLE = 0, HEAD, BODY_LEN, BODY_EOF, CHUNK_SIZE, CHUNK_DATA, CHUNK_CRLF, TRAILER, DEAD };
/* reason scopes */
enum { SC_REQUEST = 0, SC_CONN = 1, SC_CONNECT = 2 };
/* openai+http:// (sse): what the event buffer holds (fast_sse.py reads it): a data event,
 * data: [DONE], or the reason of an ended request, typed so Python words it as the Python
 * engine does (an error body, an SSE error event's data, a Content-Type, a bad line...) */
enum { EV_DATA = 0, EV_DONE, R_TEXT, R_STATUS, R_EVERR, R_CTYPE, R_TRUNC_PENDING,
       R_TRUNC_CLEAN, R_UTF8 };
#define ERROR_BODY 300 /* openai_sse: the first 300 bytes of an error body are kept */
/* The events waiting for Python (sse): past EV_SOFT bytes the recorder is woken to take
 * them (Loop.wait), past EV_HARD the loop reads no more until they are taken, so a client
 * that cannot interpret chunks as fast as they come holds a bounded backlog (it reads
 * later instead, as the Python engine does when it falls behind). */
#define EV_SOFT (1u << 20)
#define EV_HARD (4u << 20)
/* Polling before a due time (spin_for): the wake-ups it learns from, the quantile it takes
 * by default (the 63rd of 64: one outlier does not count; run() may ask for another) and
 * the most it polls for. A VM's timed wake-up from an idle vCPU came 25 us late at the
 * median and 130-300 us at P99-P99.9 on the lent H200 host (docs/llm-scale.md); the 61st
 * of 64 and 250 us at most left lateness P99 0.11-0.21 ms at 100-200 streams there, the
 * 63rd and 500 us 0.07-0.08 ms. */
#define WAKE_N 64
#define WAKE_Q 62
#define SPIN_MAX 500000
/* Before the first request (the start's lead time) the loop takes practice timed wake-ups
 * at about the schedule's own gaps, within these bounds, so the first requests already
 * have a learnt margin (it needs 16 wake-ups to have one). */
#define PRACTICE_MIN 20000
#define PRACTICE_MAX 5000000

typedef struct {
    int64_t rid, send, end, nbytes, arrive;
    int32_t status, outcome;
} Record;

typedef struct {
    Record *v;
    size_t n, cap;
} Records;

typedef struct {
    int64_t *v;
    size_t n, cap;
} I64s;

typedef struct {
    int scope, kind;
    int64_t count;
    char reason[MAX_REASON];
} Reason;

/* one event (or reason) of a streamed response: its bytes are blob[off, off + len) */
typedef struct {
    int64_t rid, t, nbytes, off;
    int32_t len, type;
} Ev;

typedef struct {
    Ev *v;
    size_t n, cap;
} Evs;

typedef struct {
    char *v;
    size_t n, cap;
} Bytes;

typedef struct Conn {
    int fd, state, idle, reusable, eof;
    /* want_ready: a response completed while this request was still being written; the
     * connection takes the next request only once the write is done (flush_out) */
    int want_ready;
    /* draining: a send failed and what the kernel holds is being read (send_failed) */
    int draining;
    int64_t rid, t_send, t_conn, nbytes, served;
    int64_t t_arrive; /* when the kernel received the last bytes read (NO_TIME: unknown) */
    /* TLS: the session (NULL without TLS), its handshake under way, when TCP connected;
     * tx_off: what of tx (the session's output) is on the wire */
    SSL *ssl;
    int hs, initial; /* initial: opened by prepare() (its failure takes no request) */
    int64_t t_tcp;
    size_t tx_off;
    /* the requests completed ok here after the connection's first (the last MAX_SUSPECTS,
     * a ring): a stray response shows any of them may have had an earlier one's response
     * (out_of_step); the first response on a fresh connection is its own */
    int64_t sus[MAX_SUSPECTS];
    int n_sus, sus_at;
    /* output: the request (or a stamped copy), partially written when the socket is full */
    const char *out;
    size_t out_len, out_off;
    char *stamped;
    size_t stamped_cap;
    Bytes tx;
    /* http reader */
    int ps, head_req, status, keep, minor;
    int64_t remaining, body, received;
    char *buf;
    size_t blen, bcap, scan;
    char mismatch[MAX_REASON];
    /* tcp reader */
    int waiting;
    int64_t got;
    char first[32];
    size_t first_len;
    char *tail;
    size_t tail_len;
    /* sse (openai+http://): the event stream of the response in flight (llm/sse.py rules) */
    int is_stream, settled, skip_lf, ev_error, seg_stop, seg_err, seg_err_type, read_fail;
    int read_fail_type;
    int64_t n_data, ev_size, line_len, t_read;
    size_t read_mark, read_bmark, seg_mark, seg_bmark;
    Bytes line, ev, ctype, ebody, seg_why, fail_why;
} Conn;

typedef struct {
    PyObject_HEAD
    /* configuration */
    int tcp, check_seq, retry_stale, family;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char *req;
    size_t req_len, req_cut; /* req_cut: where the stamp header goes (http) */
    int head_req;
    char *delim;
    size_t delim_len;
    int64_t resp_len; /* tcp: -1 when delimited */
    int64_t max_header, max_line, max_body;
    int64_t timeout_ns;
    double timeout_s;
    int64_t first_measured;
    /* schedule */
    int64_t *times; /* intended offsets, ns */
    int64_t n, next_i, n_done, n_sent;
    uint8_t *done, *retried;
    int64_t *disp; /* dispatch offset per request id */
    int64_t disp_taken;
    /* queue: ring of request ids, FIFO (the stale retry goes to the head); q_retries of
     * them are stale retries (retried[rid] set), each for a new connection only */
    int64_t *q;
    int64_t q_cap, q_head, q_len, q_retries;
    /* pool */
    Conn *conns;
    int cap, n_open, n_connecting, *idle, n_idle, *free_slots, n_free;
    int64_t opened, connect_failures, max_open;
    /* run state */
    /* ep_wake: an epoll set of the wake-up alone, to sleep to a due time without being
     * woken by replies (defer_ns) */
    int ep, wake_fd, ep_wake;
    int64_t start_ns;
    volatile int stopping, ended, running;
    int precise, finished, short_slice;
    /* sse: the loop stopped reading at EV_HARD this often, for this long (chunks read
     * together after a pause share the last one's kernel time) */
    int64_t pauses, paused_ns;
    int pausing;
    int64_t slice_ns;
    /* timed wake-ups: how late the last WAKE_N returned (ns, a ring), and the margin the
     * loop polls for before a due time, learnt from them (see spin_for) */
    int64_t wake_late[WAKE_N];
    int wake_k, wake_seen, wake_q, spin_div;
    int64_t spin_learnt, spin_max_used, poll_ns, practice_ns;
    /* A send due within defer_ns: sleep to it without waking for replies, and read them
     * then (0: never). A reply's time is the kernel's receive stamp (arrive), which a later
     * read does not move, and a timed wake-up per request is saved (~8 us of CPU here). */
    int64_t defer_ns;
    /* A due request may wait this long, so that one timed wake-up sends every request due
     * within it (0: each is woken for). Its wait is its lateness, recorded as any other. */
    int64_t coalesce_ns;
    /* the blocking waits of the run, those that returned with events (a reply, a connect),
     * and the practice wake-ups taken before the first request */
    int64_t waits, woken, practiced;
    /* CLOCK_REALTIME minus CLOCK_MONOTONIC (ns), read at the start and at every sweep: a
     * kernel receive stamp (realtime) becomes this loop's time with no clock read of its
     * own. NTP slews both clocks alike; only a step of the realtime clock moves it. */
    int64_t real_off;
    /* TLS: the client context (NULL: plaintext), the name sent and verified, whether it is
     * an IP address (verified against the certificate's IP entries, never sent as SNI) */
    SSL_CTX *tls;
    char *tls_name;
    int tls_ip, tls_verify, tls_check_host;
    FILE *keylog; /* SSLKEYLOGFILE's, when the Python engine's context has one */
    char *pbuf; /* what one read decrypted to */
    I64s conn_ns, hs_ns; /* each opened connection's TCP connect and TLS handshake times */
    /* outputs, guarded by mu */
    pthread_mutex_t mu;
    Records recs;
    I64s fixes; /* request ids already taken as ok, found out of step since: protocol */
    I64s queued;
    Reason reasons[MAX_REASONS];
    int n_reasons;
    char *rbuf;
    char *scratch;
    size_t scratch_cap;
    /* sse (openai+http://): each request's own bytes, the SSE bounds, the events taken by
     * take() (guarded by mu), requests Python found failed that the loop is to cut, and the
     * typed reason of the next record (set just before it is recorded) */
    int sse;
    char *reqs;
    int64_t *req_off;
    int64_t max_event, sse_max_line;
    Evs evs;
    Bytes blob;
    I64s cuts;
    int rtype;
    const char *rdata;
    size_t rlen;
    pthread_cond_t ev_cv; /* sse: events past EV_SOFT, the loop's end, or a take */
    int woke; /* ev_cv was signalled for the backlog now waiting */
} Loop;

static int64_t clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t now_rel(Loop *L) { return clock_ns() - L->start_ns; }

/* real_off: the realtime clock read between two monotonic readings (their midpoint) */
static void real_offset(Loop *L) {
    struct timespec r;
    int64_t a = clock_ns();
    clock_gettime(CLOCK_REALTIME, &r);
    int64_t b = clock_ns();
    L->real_off = (int64_t)r.tv_sec * 1000000000LL + r.tv_nsec - (a + (b - a) / 2);
}

/* A receive stamp is at most the end it belongs to (a step of the realtime clock between
 * two sweeps could put it after) */
static inline int64_t stamp_end(int64_t arrive, int64_t end) {
    return arrive != NO_TIME && arrive > end ? end : arrive;
}

/* Zeroed memory whose pages are all touched now: calloc's fresh pages would be faulted in as
 * the run reaches them, so a schedule too big for memory would fail minutes in, and the
 * process's RSS would grow through the run as if it leaked. */
static void *touched(size_t n) {
    char *p = calloc(n, 1);
    /* a write to each page (volatile: a compiler may fold malloc + memset back into calloc) */
    for (size_t i = 0; p && i < n; i += 4096) ((volatile char *)p)[i] = 0;
    return p;
}

/* ---- small helpers ------------------------------------------------------------------ */

static int grow(void **v, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    void *p = realloc(*v, c * elem);
    if (!p) return -1;
    *v = p;
    *cap = c;
    return 0;
}

/* Python's repr() of a bytes object: b'...' (or b"..." when it holds ' and no "). */
static void repr_bytes(char *out, size_t cap, const char *s, size_t n) {
    int sq = 0, dq = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\'') sq = 1;
        if (s[i] == '"') dq = 1;
    }
    char q = (sq && !dq) ? '"' : '\'';
    size_t o = 0;
#define PUT(c) do { if (o + 1 < cap) out[o++] = (c); } while (0)
    PUT('b');
    PUT(q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == (unsigned char)q || c == '\\') { PUT('\\'); PUT(c); }
        else if (c == '\t') { PUT('\\'); PUT('t'); }
        else if (c == '\n') { PUT('\\'); PUT('n'); }
        else if (c == '\r') { PUT('\\'); PUT('r'); }
        else if (c < 32 || c >= 127) {
            const char *hx = "0123456789abcdef";
            PUT('\\'); PUT('x'); PUT(hx[c >> 4]); PUT(hx[c & 15]);
        } else PUT(c);
    }
    PUT(q);
#undef PUT
    out[o < cap ? o : cap - 1] = 0;
}

static void note_reason(Loop *L, int scope, int kind, const char *reason) {
    for (int i = 0; i < L->n_reasons; i++) {
        Reason *r = &L->reasons[i];
        if (r->scope == scope && r->kind == kind && !strcmp(r->reason, reason)) {
            r->count++;
            return;
        }
    }
    Reason *r;
    if (L->n_reasons < MAX_REASONS) r = &L->reasons[L->n_reasons++];
    else { /* the table is full: the last slot becomes "(other reasons)" */
        r = &L->reasons[MAX_REASONS - 1];
        if (strcmp(r->reason, "(other reasons)")) {
            snprintf(r->reason, MAX_REASON, "(other reasons)");
        }
        r->count++;
        return;
    }
    r->scope = scope;
    r->kind = kind;
    r->count = 1;
    snprintf(r->reason, MAX_REASON, "%s", reason);
}

static const char *KIND_NAMES[] = {"ok", "connect", "timeout", "reset", "status_4xx",
                                   "status_5xx", "protocol", "truncated", "too_large",
                                   "upgrade", "stale_connection", "malformed_sse",
                                   "server_error", "no_token", "tls"};

/* ---- the event buffer (sse) ------------------------------------------------------------ */

static int put(Bytes *b, const char *d, size_t n) {
    if (grow((void **)&b->v, &b->cap, b->n + n + 1, 1)) return -1;
    if (n) memcpy(b->v + b->n, d, n);
    b->n += n;
    return 0;
}

/* What a connection keeps of a buffer once its response (or request) is done: more (a 16
 * MiB event, a long line or header block, a large request's ciphertext) is given back
 * then, so only a connection with a response in progress holds more than this
 * (docs/bench.md, "Memory a run holds"; blocks of 256 KiB and up are mappings of their
 * own, returned when freed). Within a response they are kept: a stream of big events
 * reuses them instead of faulting fresh pages in for each. */
#define KEEP_BUF (64u << 10)

static void give_back(Bytes *b, size_t keep) {
    if (b->cap <= keep || b->n) return;
    free(b->v);
    b->v = NULL;
    b->cap = 0;
}

/* A connection's request or response ended (keep KEEP_BUF), or the connection did (0):
 * the buffers of its readers, and its TLS output once it is all sent. */
static void conn_give_back(Conn *c, size_t keep) {
    Bytes *bufs[] = {&c->line, &c->ev, &c->ctype, &c->ebody, &c->seg_why, &c->fail_why};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        bufs[i]->n = 0;
        give_back(bufs[i], keep);
    }
    if (c->tx_off >= c->tx.n) {
        c->tx.n = c->tx_off = 0;
        give_back(&c->tx, keep);
    }
    if (c->bcap > keep) {
        free(c->buf);
        c->buf = NULL;
        c->bcap = c->blen = 0;
    }
    if (c->stamped_cap > keep && c->out != c->stamped) {
        free(c->stamped);
        c->stamped = NULL;
        c->stamped_cap = 0;
    }
}

static size_t ev_bytes(Loop *L) { return L->evs.n * sizeof(Ev) + L->blob.n; }

static void ev_push(Loop *L, int64_t rid, int64_t t, int64_t nbytes, int type, const char *d,
                    size_t n) {
    if (grow((void **)&L->evs.v, &L->evs.cap, L->evs.n + 1, sizeof(Ev))) return;
    size_t off = L->blob.n;
    if (put(&L->blob, d, n)) return;
    Ev *e = &L->evs.v[L->evs.n++];
    e->rid = rid;
    e->t = t;
    e->nbytes = nbytes;
    e->off = (int64_t)off;
    e->len = (int32_t)n;
    e->type = type;
    if (!L->woke && ev_bytes(L) >= EV_SOFT) { /* the recorder takes them now */
        L->woke = 1;
        pthread_cond_broadcast(&L->ev_cv);
    }
}

/* ---- the queue ---------------------------------------------------------------------- */

/* A queued request whose retried flag is set is a stale retry (on_stale sets it before
 * it queues the request, which then leaves the queue only once): q_retries counts them. */
static void q_push_back(Loop *L, int64_t rid) {
    L->q[(L->q_head + L->q_len) % L->q_cap] = rid;
    L->q_len++;
    L->q_retries += L->retried[rid];
}
static void q_push_front(Loop *L, int64_t rid) {
    L->q_head = (L->q_head + L->q_cap - 1) % L->q_cap;
    L->q[L->q_head] = rid;
    L->q_len++;
    L->q_retries += L->retried[rid];
}
static int64_t q_pop_front(Loop *L) {
    int64_t rid = L->q[L->q_head];
    L->q_head = (L->q_head + 1) % L->q_cap;
    L->q_len--;
    L->q_retries -= L->retried[rid];
    return rid;
}
/* The request k places behind the head leaves the queue (those before it move up). */
static int64_t q_pop_at(Loop *L, int64_t k) {
    int64_t rid = L->q[(L->q_head + k) % L->q_cap];
    for (int64_t j = k; j > 0; j--)
        L->q[(L->q_head + j) % L->q_cap] = L->q[(L->q_head + j - 1) % L->q_cap];
    L->q[L->q_head] = rid;
    return q_pop_front(L);
}
/* With stale retries queued: the oldest request a connection may carry. A retry goes
 * only on a connection opened for it (fresh: none served yet), since a reused one may
 * have been closed by the server as the first was; a fresh one takes the first retry in
 * the queue (only it can), else the oldest request; a reused one the oldest request that
 * is not a retry. -1: none. */
static int64_t q_take(Loop *L, int fresh) {
    int64_t other = -1;
    for (int64_t k = 0; k < L->q_len; k++) {
        int64_t rid = L->q[(L->q_head + k) % L->q_cap];
        if (L->retried[rid] == fresh && !L->done[rid]) return q_pop_at(L, k);
        if (other < 0 && fresh && !L->done[rid]) other = k;
    }
    return other >= 0 ? q_pop_at(L, other) : -1;
}

/* ---- recording ---------------------------------------------------------------------- */

static void check_finished(Loop *L) {
    int64_t n = L->ended ? L->next_i : L->n;
    if (L->next_i >= n && L->n_done >= n) L->finished = 1;
}

/* A request ends (exactly once: the done flag). */
static int64_t record_at(Loop *L, int64_t rid, int outcome, int status, int64_t send,
                         int64_t end, int64_t arrive, int64_t nbytes, const char *reason) {
    int rtype = L->rtype;
    const char *rdata = L->rdata;
    size_t rlen = L->rlen;
    L->rtype = 0;
    if (rid < 0 || L->done[rid]) return -1;
    L->done[rid] = 1;
    L->n_done++;
    if (rid >= L->first_measured) L->n_sent++;
    if (L->sse) { /* Python words the reason once the stream's JSON is read (fast_sse.py) */
        if (outcome || rtype) {
            if (!rtype) {
                rdata = reason && *reason ? reason : KIND_NAMES[outcome];
                rlen = strlen(rdata);
            }
            ev_push(L, rid, end, nbytes, rtype ? rtype : R_TEXT, rdata, rlen);
        }
    } else if (outcome && rid >= L->first_measured) {
        note_reason(L, SC_REQUEST, outcome, reason && *reason ? reason : KIND_NAMES[outcome]);
    }
    if (grow((void **)&L->recs.v, &L->recs.cap, L->recs.n + 1, sizeof(Record)) == 0) {
        Record *r = &L->recs.v[L->recs.n++];
        r->rid = rid;
        r->send = send;
        r->end = end;
        r->arrive = arrive;
        r->nbytes = nbytes;
        r->status = status;
        r->outcome = outcome;
    }
    check_finished(L);
    return (int64_t)L->recs.n - 1;
}

/* A request that ended without a reply's bytes to time (connect, time-out, reset...). */
static int64_t record(Loop *L, int64_t rid, int outcome, int status, int64_t send,
                      int64_t end, int64_t nbytes, const char *reason) {
    return record_at(L, rid, outcome, status, send, end, NO_TIME, nbytes, reason);
}

/* ---- connections -------------------------------------------------------------------- */

static void maybe_open(Loop *L);
static void opened(Loop *L, Conn *c);
static void ready(Loop *L, Conn *c, int64_t now);
static void conn_ended(Loop *L, Conn *c, int err);
static void send_failed(Loop *L, Conn *c, int err);

static void tls_free(Conn *c) {
    if (!c->ssl) return;
    SSL_free(c->ssl); /* (and its two BIOs) */
    c->ssl = NULL;
    c->hs = 0;
    c->tx.n = c->tx_off = 0;
}

static int usable(Conn *c) { return c->reusable && c->state == C_OPEN && !c->eof; }

static void idle_remove(Loop *L, Conn *c) {
    if (!c->idle) return;
    int k = (int)(c - L->conns);
    for (int i = L->n_idle - 1; i >= 0; i--) {
        if (L->idle[i] == k) {
            memmove(&L->idle[i], &L->idle[i + 1], (size_t)(L->n_idle - i - 1) * sizeof(int));
            L->n_idle--;
            break;
        }
    }
    c->idle = 0;
}

/* Drop a connection now; a request in flight is the caller's to account. */
static void conn_close(Loop *L, Conn *c) {
    if (c->state == C_FREE) return;
    int was_open = c->state == C_OPEN;
    idle_remove(L, c);
    if (c->fd >= 0) close(c->fd); /* also leaves the epoll set */
    c->fd = -1;
    tls_free(c);
    c->out = NULL;
    conn_give_back(c, 0); /* a closed slot holds nothing (it may not be used again) */
    c->state = C_FREE;
    c->rid = -1;
    L->free_slots[L->n_free++] = (int)(c - L->conns);
    if (was_open) {
        L->n_open--;
        if (L->q_len && !L->stopping) maybe_open(L);
    }
}

/* A connection attempt failed (kind CONNECT, TLS_K in the handshake, RESET after it). */
static void attempt_failed(Loop *L, Conn *c, int kind, const char *reason, int initial) {
    c->state = C_FREE;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    tls_free(c);
    L->free_slots[L->n_free++] = (int)(c - L->conns);
    L->n_connecting--;
    L->connect_failures++;
    note_reason(L, SC_CONNECT, kind, reason);
    if (L->q_len && !initial) {
        /* The oldest waiting request could not get this connection. */
        int64_t rid = q_pop_front(L);
        record(L, rid, kind, 0, NO_TIME, now_rel(L), 0, reason);
        if (L->q_len && !L->stopping) maybe_open(L);
    }
}

static void connect_failed(Loop *L, Conn *c, const char *reason, int initial) {
    attempt_failed(L, c, CONNECT, reason, initial);
}

static void push_i64(I64s *a, int64_t v) {
    if (grow((void **)&a->v, &a->cap, a->n + 1, sizeof(int64_t)) == 0) a->v[a->n++] = v;
}

static void tls_start(Loop *L, Conn *c);

/* TCP is connected: the connection is open, or (TLS) its handshake starts. */
static void connected(Loop *L, Conn *c) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)(c - L->conns)};
    epoll_ctl(L->ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->t_tcp = now_rel(L);
    if (L->tls) {
        tls_start(L, c);
        return;
    }
    opened(L, c);
}

/* The connection is up (TCP, and the TLS handshake when there is one). */
static void opened(Loop *L, Conn *c) {
    int64_t now = now_rel(L);
    push_i64(&L->conn_ns, c->t_tcp - c->t_conn);
    if (c->ssl) push_i64(&L->hs_ns, now - c->t_tcp);
    c->state = C_OPEN;
    L->n_connecting--;
    L->n_open++;
    L->opened++;
    if (L->n_open > L->max_open) L->max_open = L->n_open;
    if (L->stopping) {
        conn_close(L, c);
        return;
    }
    ready(L, c, now);
}

static void open_conn(Loop *L, int initial) {
    /* the caller has counted it in n_connecting */
    char reason[MAX_REASON];
    Conn *c = &L->conns[L->free_slots[--L->n_free]];
    memset(c, 0, offsetof(Conn, stamped));
    c->rid = -1;
    c->reusable = 1;
    c->state = C_CONNECTING;
    c->initial = initial;
    c->t_conn = now_rel(L);
    c->blen = 0;
    c->tail_len = 0;
    c->tx.n = 0;
    c->fd = socket(L->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        snprintf(reason, sizeof reason, "[Errno %d] %s", errno, strerror(errno));
        connect_failed(L, c, reason, initial);
        return;
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* as uvloop does */
    /* the kernel's receive time of what each read returns (on_readable); if refused,
     * arrive times are unknown */
    setsockopt(c->fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
    int r = connect(c->fd, (struct sockaddr *)&L->addr, L->addrlen);
    if (r < 0 && errno != EINPROGRESS) {
        snprintf(reason, sizeof reason, "[Errno %d] %s", errno, strerror(errno));
        connect_failed(L, c, reason, initial);
        return;
    }
    struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = (uint64_t)(c - L->conns)};
    epoll_ctl(L->ep, EPOLL_CTL_ADD, c->fd, &ev);
    if (r == 0) connected(L, c);
}

static void maybe_open(Loop *L) {
    while (L->q_len > L->n_connecting && L->n_connecting < MAX_CONNECTING &&
           L->n_open + L->n_connecting < L->cap && L->n_free > 0) {
        L->n_connecting++;
        open_conn(L, 0);
    }
}

/* ---- TLS over memory BIOs (tls.py's rules: the name, the reasons) ----------------------- */

static void epoll_set(Loop *L, Conn *c, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.u64 = (uint64_t)(c - L->conns)};
    epoll_ctl(L->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* buf[*off, len) to the socket: 0 when all is sent, 1 when the socket is full (the rest
 * goes on EPOLLOUT), -1 on a send error (errno). */
static int send_rest(Loop *L, Conn *c, const char *buf, size_t len, size_t *off) {
    while (*off < len) {
        ssize_t n = send(c->fd, buf + *off, len - *off, MSG_NOSIGNAL);
        if (n > 0) {
            *off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            epoll_set(L, c, EPOLLIN | EPOLLOUT);
            return 1;
        }
        if (n == 0) errno = EPIPE;
        return -1;
    }
    return 0;
}

/* What the session wrote goes to the socket (send_rest's answer). */
static int tls_push(Loop *L, Conn *c) {
    BIO *w = SSL_get_wbio(c->ssl);
    size_t pend;
    while ((pend = BIO_ctrl_pending(w)) > 0) {
        if (grow((void **)&c->tx.v, &c->tx.cap, c->tx.n + pend, 1)) {
            errno = ENOMEM;
            return -1;
        }
        int got = BIO_read(w, c->tx.v + c->tx.n, (int)pend);
        if (got <= 0) break;
        c->tx.n += (size_t)got;
    }
    int r = send_rest(L, c, c->tx.v, c->tx.n, &c->tx_off);
    if (r == 0) {
        c->tx.n = c->tx_off = 0;
        give_back(&c->tx, KEEP_BUF);
    }
    return r;
}

/* tls._why: an OpenSSL reason as Python's ssl module names it, lower case with spaces */
static void tls_reason_text(char *out, size_t cap, const char *what) {
    snprintf(out, cap, "TLS: %s", what);
    for (char *p = out + 5; *p; p++) {
        if (*p == '_') *p = ' ';
        else if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
    }
}

/* Why a TLS call failed (tls.handshake_reason's words), from OpenSSL's error queue, the
 * certificate check or errno; the queue is left empty. */
static void tls_why(Loop *L, Conn *c, int err, char *out, size_t cap) {
    unsigned long e = ERR_peek_last_error();
    long v = SSL_get_verify_result(c->ssl);
    if (err == SSL_ERROR_SSL && ERR_GET_REASON(e) == SSL_R_CERTIFICATE_VERIFY_FAILED &&
        v != X509_V_OK) {
        /* (Python's own words for a name mismatch: _ssl.c fill_and_set_sslerror) */
        if (v == X509_V_ERR_HOSTNAME_MISMATCH)
            snprintf(out, cap, "TLS: certificate verify failed: Hostname mismatch, certificate "
                     "is not valid for '%s'.", L->tls_name);
        else if (v == X509_V_ERR_IP_ADDRESS_MISMATCH)
            snprintf(out, cap, "TLS: certificate verify failed: IP address mismatch, "
                     "certificate is not valid for '%s'.", L->tls_name);
        else
            snprintf(out, cap, "TLS: certificate verify failed: %s",
                     X509_verify_cert_error_string(v));
    } else if (err == SSL_ERROR_SSL && e) {
        const char *r = ERR_reason_error_string(e);
        tls_reason_text(out, cap, r ? r : "error");
    } else {
        snprintf(out, cap, "TLS: the server closed the connection during the handshake (%s)",
                 errno ? strerror(errno) : "EOF");
    }
    ERR_clear_error();
}

/* One step of the handshake (after TCP connected, and each time ciphertext came). */
static void tls_step(Loop *L, Conn *c) {
    char reason[MAX_REASON];
    ERR_clear_error();
    errno = 0;
    int r = SSL_do_handshake(c->ssl);
    int err = r == 1 ? SSL_ERROR_NONE : SSL_get_error(c->ssl, r);
    if (err != SSL_ERROR_NONE && err != SSL_ERROR_WANT_READ) {
        tls_why(L, c, err, reason, sizeof reason);
        tls_push(L, c); /* the alert, when there is one (as Python sends it) */
        attempt_failed(L, c, TLS_K, reason, c->initial);
        return;
    }
    int p = tls_push(L, c);
    if (p < 0) {
        snprintf(reason, sizeof reason, "TLS: the server closed the connection during the "
                 "handshake (%s)", strerror(errno));
        attempt_failed(L, c, TLS_K, reason, c->initial);
        return;
    }
    if (p == 0) epoll_set(L, c, EPOLLIN);
    if (err == SSL_ERROR_NONE) {
        c->hs = 0;
        opened(L, c);
    }
}

static void tls_start(Loop *L, Conn *c) {
    char reason[MAX_REASON];
    BIO *rb = BIO_new(BIO_s_mem()), *wb = BIO_new(BIO_s_mem());
    c->ssl = SSL_new(L->tls);
    if (!c->ssl || !rb || !wb) {
        BIO_free(rb);
        BIO_free(wb);
        snprintf(reason, sizeof reason, "TLS: could not make a session (out of memory)");
        attempt_failed(L, c, TLS_K, reason, c->initial);
        return;
    }
    BIO_set_mem_eof_return(rb, -1); /* no ciphertext yet: "want read", not EOF */
    SSL_set_bio(c->ssl, rb, wb);
    SSL_set_connect_state(c->ssl);
    if (L->tls_name && !L->tls_ip) SSL_set_tlsext_host_name(c->ssl, L->tls_name);
    if (L->tls_name && L->tls_verify && L->tls_check_host) {
        X509_VERIFY_PARAM *vp = SSL_get0_param(c->ssl); /* (host flags: the context's) */
        if (L->tls_ip) X509_VERIFY_PARAM_set1_ip_asc(vp, L->tls_name);
        else X509_VERIFY_PARAM_set1_host(vp, L->tls_name, 0);
    }
    c->hs = 1;
    tls_step(L, c);
}

/* A handshake's socket is readable: its ciphertext goes to the session. */
static void tls_hs_readable(Loop *L, Conn *c) {
    char reason[MAX_REASON];
    for (;;) {
        ssize_t r = recv(c->fd, L->rbuf, READ_CHUNK, 0);
        if (r > 0) {
            BIO_write(SSL_get_rbio(c->ssl), L->rbuf, (int)r);
            if (r < READ_CHUNK) break;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        snprintf(reason, sizeof reason, "TLS: the server closed the connection during the "
                 "handshake (%s)", r == 0 ? "EOF" : strerror(errno));
        attempt_failed(L, c, TLS_K, reason, c->initial);
        return;
    }
    tls_step(L, c);
}

/* A connection attempt passed the time-out (tls.dial: TCP, or the handshake). */
static void attempt_timed_out(Loop *L, Conn *c) {
    epoll_ctl(L->ep, EPOLL_CTL_DEL, c->fd, NULL);
    if (c->hs) attempt_failed(L, c, TLS_K, "TLS: handshake timed out", c->initial);
    else connect_failed(L, c, "TimeoutError", c->initial);
}

static int out_pending(Conn *c) { return c->out_off < c->out_len || c->tx_off < c->tx.n; }

/* The request goes on the wire (TLS: through the session, then its output). */
static void flush_out(Loop *L, Conn *c) {
    if (!out_pending(c)) return;
    int r;
    if (c->ssl) {
        if (c->out_off < c->out_len) {
            ERR_clear_error();
            int w = SSL_write(c->ssl, c->out + c->out_off, (int)(c->out_len - c->out_off));
            if (w > 0) c->out_off += (size_t)w;
            else if (SSL_get_error(c->ssl, w) != SSL_ERROR_WANT_READ) { /* (retried on read) */
                ERR_clear_error();
                conn_ended(L, c, EPROTO);
                conn_close(L, c);
                return;
            }
        }
        r = tls_push(L, c);
        if (r == 0 && c->out_off < c->out_len) return; /* (a write that has to read first) */
    } else r = send_rest(L, c, c->out, c->out_len, &c->out_off);
    if (r > 0) return;
    if (r < 0) {
        send_failed(L, c, errno);
        return;
    }
    if (c->want_ready) { /* the response came first; now the connection is free */
        c->want_ready = 0;
        if (usable(c)) ready(L, c, now_rel(L));
        else conn_close(L, c);
    }
}

/* The reader waits for the response to the request about to go out. */
static void expect_resp(Loop *L, Conn *c) {
    if (L->tcp) {
        c->waiting = 1;
        c->got = 0;
        c->tail_len = 0;
        c->first_len = 0;
    } else {
        c->ps = HEAD;
        c->head_req = L->head_req;
        c->received = 0;
        c->scan = 0;
        c->body = 0;
        c->blen = 0;
        c->mismatch[0] = 0;
    }
    if (L->sse) { /* openai_sse._reset: a fresh event stream per request */
        c->status = 0;
        c->is_stream = 1;
        c->settled = c->skip_lf = c->ev_error = c->seg_stop = c->seg_err = c->read_fail = 0;
        c->n_data = c->ev_size = c->line_len = 0;
        Bytes *bufs[] = {&c->line, &c->ev, &c->ctype, &c->ebody, &c->seg_why, &c->fail_why};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) bufs[i]->n = 0;
    }
}

static void send_req(Loop *L, Conn *c, int64_t rid, int64_t now) {
    c->rid = rid;
    c->t_send = now;
    c->t_arrive = NO_TIME;
    c->nbytes = 0;
    expect_resp(L, c);
    if (L->sse) { /* each request's own bytes (the workload's prompt) */
        c->out = L->reqs + L->req_off[rid];
        c->out_len = (size_t)(L->req_off[rid + 1] - L->req_off[rid]);
    } else if (L->check_seq) {
        char stamp[48];
        int sl;
        size_t cut = L->tcp ? 0 : L->req_cut;
        if (L->tcp) sl = snprintf(stamp, sizeof stamp, "%lld:", (long long)rid);
        else sl = snprintf(stamp, sizeof stamp, "X-Tailgate-Seq: %lld\r\n", (long long)rid);
        size_t need = L->req_len + (size_t)sl;
        if (grow((void **)&c->stamped, &c->stamped_cap, need, 1)) need = 0;
        memcpy(c->stamped, L->req, cut);
        memcpy(c->stamped + cut, stamp, (size_t)sl);
        memcpy(c->stamped + cut + sl, L->req + cut, L->req_len - cut);
        c->out = c->stamped;
        c->out_len = need;
    } else {
        c->out = L->req;
        c->out_len = L->req_len;
    }
    c->out_off = 0;
    flush_out(L, c);
}

/* A connection is free: it takes the oldest queued request, or waits idle. */
static void ready(Loop *L, Conn *c, int64_t now) {
    if (c->idle || c->rid >= 0) return; /* never twice (engine._ready asserts it) */
    if (out_pending(c)) {
        /* The server answered before it read the whole request (a large body): the next
         * request must not start until this one is on the wire (flush_out calls back). */
        c->want_ready = 1;
        return;
    }
    while (L->q_len && !L->stopping) {
        int64_t rid = L->q_retries ? q_take(L, c->served == 0) : q_pop_front(L);
        if (rid < 0) break; /* only retries wait, for a new connection (see on_stale) */
        if (L->done[rid]) continue;
        send_req(L, c, rid, now);
        return;
    }
    c->idle = 1;
    L->idle[L->n_idle++] = (int)(c - L->conns);
}

/* A reused connection died before any response byte: retry once (on a new connection:
 * q_take), or record it. The cap never holds the retry back, so no idle connection is
 * closed for it: the caller's conn_close of this connection frees the slot and opens one
 * (q_len > n_connecting unless one is opening already), and a new connection takes a
 * waiting retry before anything else; one that fails to open records the queue's head,
 * where the latest retry is. */
static void on_stale(Loop *L, Conn *c, int64_t rid, const char *reason) {
    if (L->retry_stale && !L->retried[rid] && !L->done[rid] && !L->stopping) {
        L->retried[rid] = 1;
        q_push_front(L, rid);
        maybe_open(L);
        return;
    }
    record(L, rid, STALE, 0, c->t_send, now_rel(L), 0, reason);
}

/* The response to the request in flight is complete. The caller frees the connection. */
static void complete(Loop *L, Conn *c, int outcome, int status, const char *reason) {
    int64_t rid = c->rid;
    c->rid = -1;
    int reused = c->served > 0;
    c->served++;
    /* sse: a stream ended by its framing after a finish_reason may be ok (Python decides) */
    int maybe_ok = outcome == OK || (L->sse && L->rtype == R_TRUNC_CLEAN);
    int64_t end = now_rel(L);
    int64_t at = record_at(L, rid, outcome, status, c->t_send, end, stamp_end(c->t_arrive, end),
                           c->nbytes, reason);
    if (at >= 0 && maybe_ok && reused) {
        c->sus[c->sus_at] = rid;
        c->sus_at = (c->sus_at + 1) % MAX_SUSPECTS;
        if (c->n_sus < MAX_SUSPECTS) c->n_sus++;
    }
    conn_give_back(c, KEEP_BUF); /* (its reason is recorded: nothing points into them) */
}

/* A response nobody asked for arrived on this connection: it is out of step, and each
 * request completed ok here after its first may have had an earlier request's response
 * (engine.on_out_of_step): those become protocol. A record not yet taken is changed in
 * place; one taken already is listed in fixes (Python moves it from ok). */
static void out_of_step(Loop *L, Conn *c) {
    for (int k = 0; k < c->n_sus; k++) {
        int64_t rid = c->sus[k];
        if (L->sse) { /* Python relabels those it recorded ok, once their JSON is read */
            if (grow((void **)&L->fixes.v, &L->fixes.cap, L->fixes.n + 1, sizeof(int64_t)) == 0)
                L->fixes.v[L->fixes.n++] = rid;
            continue;
        }
        size_t j = L->recs.n;
        while (j > 0 && L->recs.v[j - 1].rid != rid) j--;
        if (j > 0) {
            if (L->recs.v[j - 1].outcome != OK) continue;
            L->recs.v[j - 1].outcome = PROTOCOL;
        } else if (grow((void **)&L->fixes.v, &L->fixes.cap, L->fixes.n + 1,
                        sizeof(int64_t)) == 0) {
            L->fixes.v[L->fixes.n++] = rid;
        } else continue;
        if (rid >= L->first_measured) note_reason(L, SC_REQUEST, PROTOCOL, OUT_OF_STEP);
    }
    c->n_sus = c->sus_at = 0;
}

/* The request in flight failed: report it; the connection is dropped by the caller. */
static void fail(Loop *L, Conn *c, int kind, const char *reason) {
    c->reusable = 0;
    if (c->rid >= 0) {
        int64_t rid = c->rid;
        c->rid = -1;
        int64_t end = now_rel(L);
        record_at(L, rid, kind, 0, c->t_send, end, stamp_end(c->t_arrive, end), c->nbytes,
                  reason);
    }
    conn_give_back(c, KEEP_BUF);
}

static void stray(Loop *L, Conn *c, const char *fmt_tail, const char *data, size_t n) {
    char rep[80], reason[MAX_REASON];
    c->reusable = 0;
    repr_bytes(rep, sizeof rep, data, n < 16 ? n : 16);
    snprintf(reason, sizeof reason, "%zu byte(s) %s, starting %s", n, fmt_tail, rep);
    note_reason(L, SC_CONN, PROTOCOL, reason);
    out_of_step(L, c);
}

/* ---- HTTP/1.1 response framing (http1.py) -------------------------------------------- */

typedef struct {
    int kind; /* 0: none */
    char reason[MAX_REASON];
} Err;

static int seterr(Err *e, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int seterr(Err *e, int kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->reason, MAX_REASON, fmt, ap);
    va_end(ap);
    e->kind = kind;
    return -1;
}

static int head_error(Err *e, const char *s, size_t n, const char *why) {
    char rep[220];
    repr_bytes(rep, sizeof rep, s, n < 48 ? n : 48);
    return seterr(e, PROTOCOL, "%s: %s", why, rep);
}

static int tchar(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int ieq(const char *a, size_t n, const char *lit) {
    size_t m = strlen(lit);
    if (n != m) return 0;
    for (size_t i = 0; i < n; i++) {
        char x = a[i];
        if (x >= 'A' && x <= 'Z') x = (char)(x + 32);
        if (x != lit[i]) return 0;
    }
    return 1;
}

static void strip(const char **s, size_t *n) {
    while (*n && (**s == ' ' || **s == '\t')) { (*s)++; (*n)--; }
    while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t')) (*n)--;
}

/* The next item of a comma-separated field value, stripped (empty items included):
 * 1 with (*t, *tl) set and *at moved past it, 0 when the list is done. Start with *at 0. */
static int next_item(const char *v, size_t n, size_t *at, const char **t, size_t *tl) {
    if (*at > n) return 0;
    size_t j = *at;
    while (j < n && v[j] != ',') j++;
    *t = v + *at;
    *tl = j - *at;
    strip(t, tl);
    *at = j + 1;
    return 1;
}

/* Does the comma-separated list (lower-cased) hold token ``tok``? */
static int has_token(const char *v, size_t n, const char *tok) {
    size_t at = 0, tl;
    const char *t;
    while (next_item(v, n, &at, &t, &tl))
        if (ieq(t, tl, tok)) return 1;
    return 0;
}

enum { F_TE = 0, F_CL, F_CONN, F_SEQ, F_UPGRADE, F_CTYPE, F_OTHER };
#define MAX_FIELDS 64

typedef struct {
    int which;
    size_t off, len; /* into the scratch buffer */
} Field;

/* Parse one header block (without its final blank line) and set up the body state.
 * Returns 1 when the response is complete (End), 0 when a body follows or it was a 1xx
 * (state stays HEAD), -1 on an error (e set). */
static int on_head(Loop *L, Conn *c, const char *blk, size_t n, Err *e, int *keep_out) {
    const char *nl = memchr(blk, '\n', n);
    size_t fl = nl ? (size_t)(nl - blk) : n;
    size_t first = fl;
    if (first && blk[first - 1] == '\r') first--;
    /* HTTP/1.x SP 3DIGIT [SP anything], no CR or NUL */
    int okline = first >= 12 && !memcmp(blk, "HTTP/1.", 7) && blk[7] >= '0' && blk[7] <= '9' &&
                 blk[8] == ' ' && blk[9] >= '0' && blk[9] <= '9' && blk[10] >= '0' &&
                 blk[10] <= '9' && blk[11] >= '0' && blk[11] <= '9' &&
                 (first == 12 || blk[12] == ' ');
    if (okline && (memchr(blk, '\r', first) || memchr(blk, 0, first))) okline = 0;
    if (!okline) return head_error(e, blk, first, "not an HTTP/1.x status line");
    int minor = blk[7] - '0';
    int status = (blk[9] - '0') * 100 + (blk[10] - '0') * 10 + (blk[11] - '0');
    /* field lines: copy the values we need into scratch (folds join with a space) */
    Field f[MAX_FIELDS];
    int nf = 0, last = -1; /* last: index of the previous field's entry, or -2: not kept */
    size_t so = 0;
    if (grow((void **)&L->scratch, &L->scratch_cap, n + 16, 1))
        return seterr(e, TOO_LARGE, "out of memory");
    size_t pos = nl ? fl + 1 : n;
    while (pos < n || (nl && pos == n && 0)) {
        const char *ln = blk + pos;
        const char *e2 = memchr(ln, '\n', n - pos);
        size_t ll = e2 ? (size_t)(e2 - ln) : n - pos;
        pos += ll + 1;
        if (ll && ln[ll - 1] == '\r') ll--;
        if (memchr(ln, '\r', ll) || memchr(ln, 0, ll))
            return head_error(e, ln, ll, "CR or NUL inside a header line");
        if (ll && (ln[0] == ' ' || ln[0] == '\t')) {
            if (last == -1) return head_error(e, ln, ll, "a folded line before any header field");
            if (last >= 0) { /* continue a kept value: value + " " + stripped */
                const char *v = ln;
                size_t vl = ll;
                strip(&v, &vl);
                if (f[last].off + f[last].len != so) { /* move it to the end first */
                    memmove(L->scratch + so, L->scratch + f[last].off, f[last].len);
                    f[last].off = so;
                    so += f[last].len;
                }
                L->scratch[so++] = ' ';
                memcpy(L->scratch + so, v, vl);
                so += vl;
                f[last].len += 1 + vl;
                /* python strips the joined value of surrounding spaces */
                while (f[last].len && L->scratch[f[last].off + f[last].len - 1] == ' ') {
                    f[last].len--;
                    so--;
                }
            }
            continue;
        }
        const char *colon = memchr(ln, ':', ll);
        size_t nlen = colon ? (size_t)(colon - ln) : 0;
        int good = colon && nlen > 0;
        for (size_t i = 0; good && i < nlen; i++) good = tchar((unsigned char)ln[i]);
        if (!good) return head_error(e, ln, ll, "malformed header field");
        int which = ieq(ln, nlen, "transfer-encoding") ? F_TE
                    : ieq(ln, nlen, "content-length") ? F_CL
                    : ieq(ln, nlen, "connection") ? F_CONN
                    : ieq(ln, nlen, "x-tailgate-seq") ? F_SEQ
                    : ieq(ln, nlen, "upgrade") ? F_UPGRADE
                    : L->sse && ieq(ln, nlen, "content-type") ? F_CTYPE : F_OTHER;
        if (which == F_OTHER || nf >= MAX_FIELDS) {
            last = -2;
            continue;
        }
        const char *v = colon + 1;
        size_t vl = ll - nlen - 1;
        strip(&v, &vl);
        f[nf].which = which;
        f[nf].off = so;
        f[nf].len = vl;
        memcpy(L->scratch + so, v, vl);
        so += vl;
        last = nf++;
    }
    char *S = L->scratch;
    if (status == 101) {
        const char *up = "?";
        size_t ul = 1;
        for (int i = 0; i < nf; i++)
            if (f[i].which == F_UPGRADE) { up = S + f[i].off; ul = f[i].len; break; }
        if (!ul) { up = "?"; ul = 1; }
        return seterr(e, UPGRADE, "101 Switching Protocols (to %.*s) without an upgrade request",
                      (int)(ul < 32 ? ul : 32), up);
    }
    if (status >= 100 && status < 200) return 0; /* interim: the final response follows */
    if (status < 100) return seterr(e, PROTOCOL, "status %d is not a valid status code", status);
    /* framing fields, lower-cased (http1.scan_head) */
    int keep = minor >= 1, has_conn = 0, has_te = 0, has_cl = 0;
    char joined[1024];
    size_t jl = 0;
    for (int i = 0; i < nf; i++) {
        if (f[i].which != F_CONN) continue;
        has_conn = 1;
        if (jl && jl < sizeof joined) joined[jl++] = ',';
        size_t take = f[i].len < sizeof joined - jl ? f[i].len : sizeof joined - jl;
        memcpy(joined + jl, S + f[i].off, take);
        jl += take;
    }
    if (has_conn)
        keep = !has_token(joined, jl, "close") && (minor >= 1 || has_token(joined, jl, "keep-alive"));
    c->status = status;
    if (L->sse) { /* openai_sse: no Content-Type is taken for an event stream */
        const char *ct = NULL;
        size_t cl = 0;
        for (int i = 0; i < nf; i++)
            if (f[i].which == F_CTYPE) { ct = S + f[i].off; cl = f[i].len; break; }
        if (!cl) { ct = "text/event-stream"; cl = 17; }
        c->ctype.n = 0;
        put(&c->ctype, ct, cl);
        c->is_stream = cl >= 17;
        for (size_t i = 0; c->is_stream && i < 17; i++) {
            char x = ct[i];
            if (x >= 'A' && x <= 'Z') x = (char)(x + 32);
            c->is_stream = x == "text/event-stream"[i];
        }
    }
    if (L->check_seq) {
        const char *sv = NULL;
        size_t sl = 0;
        for (int i = 0; i < nf; i++)
            if (f[i].which == F_SEQ) { sv = S + f[i].off; sl = f[i].len; break; }
        char want[32];
        int wl = snprintf(want, sizeof want, "%lld", (long long)c->rid);
        if (!sv) snprintf(c->mismatch, MAX_REASON, "response without a sequence stamp");
        else if ((size_t)wl != sl || memcmp(sv, want, sl))
            snprintf(c->mismatch, MAX_REASON, "response stamped for request %.*s, not %lld",
                     (int)(sl < 64 ? sl : 64), sv, (long long)c->rid);
    }
    if (c->head_req || status == 204 || status == 304) {
        *keep_out = keep;
        return 1;
    }
    for (int i = 0; i < nf; i++) {
        if (f[i].which == F_TE) has_te = 1;
        if (f[i].which == F_CL) has_cl = 1;
    }
    if (has_te) {
        if (minor == 0)
            return seterr(e, PROTOCOL, "Transfer-Encoding in an HTTP/1.0 response "
                                       "(faulty framing, RFC 9112 6.1)");
        /* codings: every TE value joined with ',' */
        const char *lastc = NULL;
        size_t lastl = 0;
        int chunked_before = 0;
        for (int i = 0; i < nf; i++) {
            if (f[i].which != F_TE) continue;
            size_t at = 0, tl;
            const char *t;
            while (next_item(S + f[i].off, f[i].len, &at, &t, &tl)) {
                if (lastc && ieq(lastc, lastl, "chunked")) chunked_before = 1;
                lastc = t;
                lastl = tl;
            }
        }
        if (chunked_before) return seterr(e, PROTOCOL, "chunked is not the final transfer coding");
        if (lastc && ieq(lastc, lastl, "chunked")) c->ps = CHUNK_SIZE;
        else {
            c->ps = BODY_EOF; /* read to the close (RFC 9112 6.3 rule 4) */
            keep = 0;
        }
        if (has_cl) keep = 0; /* both: TE wins, and the connection is not trusted again */
        c->keep = keep;
        c->body = 0;
        return 0;
    }
    if (has_cl) {
        int64_t length = -1;
        int64_t vals[16];
        int nv = 0;
        for (int i = 0; i < nf; i++) {
            if (f[i].which != F_CL) continue;
            const char *v = S + f[i].off, *t;
            size_t vn = f[i].len, at = 0, tl;
            while (next_item(v, vn, &at, &t, &tl)) {
                int good = tl >= 1 && tl <= 18;
                int64_t x = 0;
                for (size_t k = 0; good && k < tl; k++) {
                    good = t[k] >= '0' && t[k] <= '9';
                    x = x * 10 + (t[k] - '0');
                }
                if (!good) {
                    char rep[80];
                    repr_bytes(rep, sizeof rep, v, vn < 32 ? vn : 32);
                    return seterr(e, PROTOCOL, "bad Content-Length %s", rep);
                }
                int seen = 0;
                for (int k = 0; k < nv; k++) seen |= vals[k] == x;
                if (!seen && nv < 16) vals[nv++] = x;
            }
        }
        if (nv != 1) {
            /* sorted, as Python prints a list */
            for (int a = 0; a < nv; a++)
                for (int b = a + 1; b < nv; b++)
                    if (vals[b] < vals[a]) { int64_t t = vals[a]; vals[a] = vals[b]; vals[b] = t; }
            char lst[200];
            size_t o = 0;
            for (int k = 0; k < nv && o < sizeof lst; k++)
                o += (size_t)snprintf(lst + o, sizeof lst - o, k ? ", %lld" : "%lld", (long long)vals[k]);
            return seterr(e, PROTOCOL, "conflicting Content-Length values [%s]", lst);
        }
        length = vals[0];
        if (length > L->max_body)
            return seterr(e, TOO_LARGE, "Content-Length %lld exceeds %lld bytes",
                          (long long)length, (long long)L->max_body);
        c->keep = keep;
        c->body = 0;
        if (length == 0) {
            *keep_out = keep;
            return 1;
        }
        c->remaining = length;
        c->ps = BODY_LEN;
        return 0;
    }
    c->keep = 0;
    c->body = 0;
    c->ps = BODY_EOF;
    return 0;
}

/* Find the end of the header block in buf[from..n): sets *end (end of its last line) and
 * *next (after the blank line); returns 0 when not there yet. */
static int find_blank(const char *buf, size_t from, size_t n, size_t *end, size_t *next) {
    for (size_t i = from; i + 1 < n; i++) {
        if (buf[i] != '\n') continue;
        if (buf[i + 1] == '\n') { *end = i; *next = i + 2; return 1; }
        if (buf[i + 1] == '\r' && i + 2 < n && buf[i + 2] == '\n') {
            *end = i; *next = i + 3; return 1;
        }
    }
    return 0;
}

/* ---- server-sent events (llm/sse.py, bench/openai_sse.py) ------------------------------- */

/* Strict UTF-8, as Python's decoder (no overlongs, surrogates or code points past U+10FFFF). */
static int utf8_ok(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            unsigned char c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0)) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            unsigned char c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90)) return 0;
            i += 4;
        } else return 0;
    }
    return 1;
}

/* An error in the segment being scanned: which one wins follows SSEParser.feed: a line past
 * the bound anywhere in the segment (checked first, over all its lines), else the first
 * line or event error (seg_err 2 and 1). */
static void seg_fail(Conn *c, int level, int type, const char *d, size_t n) {
    if (c->seg_err >= level) return;
    c->seg_err = level;
    c->seg_err_type = type;
    c->seg_why.n = 0;
    put(&c->seg_why, d, n);
}

/* A blank line: the event is complete (SSEParser: data lines joined with LF). Python
 * interprets it (fast_sse.py); an ``event: error`` or ``data: [DONE]`` ends the stream. */
static void sse_dispatch(Loop *L, Conn *c) {
    if (c->n_data && !c->seg_stop) {
        if (c->ev_error) { /* openai_sse: server_error, with the event's message */
            c->seg_stop = 2;
            c->fail_why.n = 0;
            put(&c->fail_why, c->ev.v, c->ev.n);
        } else if (c->ev.n == 6 && !memcmp(c->ev.v, "[DONE]", 6)) {
            c->seg_stop = 1;
            ev_push(L, c->rid, c->t_read, c->nbytes, EV_DONE, NULL, 0);
        } else ev_push(L, c->rid, c->t_read, c->nbytes, EV_DATA, c->ev.v, c->ev.n);
    }
    c->n_data = c->ev_size = 0;
    c->ev.n = 0;
    c->ev_error = 0;
}

static void sse_line(Loop *L, Conn *c, const char *p, size_t n) {
    if (n == 0) {
        sse_dispatch(L, c);
        return;
    }
    if (p[0] == ':') return; /* a comment (keep-alive) */
    if (!utf8_ok((const unsigned char *)p, n)) {
        seg_fail(c, 1, R_UTF8, p, n);
        return;
    }
    const char *colon = memchr(p, ':', n);
    size_t nl = colon ? (size_t)(colon - p) : n;
    const char *v = colon ? colon + 1 : p + n;
    size_t vl = colon ? n - nl - 1 : 0;
    if (colon && vl && v[0] == ' ') { v++; vl--; }
    if (nl == 4 && !memcmp(p, "data", 4)) {
        c->ev_size += (int64_t)n;
        if (c->ev_size > L->max_event) {
            char why[MAX_REASON];
            int k = snprintf(why, sizeof why, "an event exceeds %lld bytes without its closing "
                             "blank line", (long long)L->max_event);
            seg_fail(c, 1, R_TEXT, why, (size_t)k);
            return;
        }
        if (c->n_data) put(&c->ev, "\n", 1);
        put(&c->ev, v, vl);
        c->n_data++;
    } else if (nl == 5 && !memcmp(p, "event", 5)) {
        c->ev_error = vl == 5 && !memcmp(v, "error", 5);
    } /* id, retry and unknown fields: ignored */
}

/* One Data segment of the body (what openai_sse._body gets: body bytes of one read, one
 * HTTP chunk at a time). Lines end in LF, CRLF or CR. */
static void sse_segment(Loop *L, Conn *c, const char *p, size_t n) {
    c->seg_mark = L->evs.n;
    c->seg_bmark = L->blob.n;
    c->seg_stop = c->seg_err = 0;
    size_t i = 0;
    while (i < n) {
        if (c->skip_lf) {
            c->skip_lf = 0;
            if (p[i] == '\n') { i++; continue; }
        }
        size_t j = i;
        while (j < n && p[j] != '\n' && p[j] != '\r') j++;
        c->line_len += (int64_t)(j - i);
        if (c->line_len > L->sse_max_line) {
            char why[MAX_REASON];
            int k = snprintf(why, sizeof why, "an event-stream line exceeds %lld bytes",
                             (long long)L->sse_max_line);
            seg_fail(c, 2, R_TEXT, why, (size_t)k);
        }
        if (j == n) { /* no line end yet: the line grows */
            if (!c->seg_err) put(&c->line, p + i, j - i);
            break;
        }
        if (!c->seg_err) {
            if (c->line.n) {
                put(&c->line, p + i, j - i);
                sse_line(L, c, c->line.v, c->line.n);
            } else sse_line(L, c, p + i, j - i);
        }
        c->line.n = 0;
        c->line_len = 0;
        if (p[j] == '\r') c->skip_lf = 1;
        i = j + 1;
    }
    if (c->seg_err) { /* SSEParser.feed raised: none of this segment's events count */
        L->evs.n = c->seg_mark;
        L->blob.n = c->seg_bmark;
        c->read_fail = c->seg_err_type == R_UTF8 ? MALFORMED_SSE : TOO_LARGE;
        c->read_fail_type = c->seg_err_type;
        c->fail_why.n = 0;
        put(&c->fail_why, c->seg_why.v, c->seg_why.n);
    } else if (c->seg_stop == 2) {
        c->read_fail = SERVER_ERROR;
        c->read_fail_type = R_EVERR;
    } else if (c->seg_stop == 1) c->settled = 1; /* the rest of the response is not read */
}

/* Body bytes of the response in flight (openai_sse._body). A failure waits for the end of
 * the read: a framing error anywhere in the read wins (ResponseReader.feed raises first). */
static void body_segment(Loop *L, Conn *c, const char *p, size_t n) {
    if (c->read_fail || !n) return;
    if (c->status != 200) {
        size_t room = c->ebody.n < ERROR_BODY ? ERROR_BODY - c->ebody.n : 0;
        put(&c->ebody, p, n < room ? n : room);
        return;
    }
    if (!c->is_stream) {
        c->read_fail = PROTOCOL;
        c->read_fail_type = R_CTYPE;
        c->fail_why.n = 0;
        put(&c->fail_why, c->ctype.v, c->ctype.n);
        return;
    }
    if (c->settled) return; /* after data: [DONE] the framing still ends the response */
    sse_segment(L, c, p, n);
}

/* The stream failed in this read: the request ends now, the connection goes. */
static void sse_fail(Loop *L, Conn *c) {
    L->rtype = c->read_fail_type;
    L->rdata = c->fail_why.v;
    L->rlen = c->fail_why.n;
    fail(L, c, c->read_fail, "");
}

/* The HTTP response is complete (openai_sse._end): its outcome as far as the framing and
 * the event boundaries tell; Python finishes it with the JSON (no_token, a finish_reason). */
static int sse_end(Loop *L, Conn *c) {
    int s = c->status;
    if (s != 200) {
        L->rtype = R_STATUS;
        L->rdata = c->ebody.v;
        L->rlen = c->ebody.n;
        return s >= 400 && s < 500 ? S4XX : s < 400 ? PROTOCOL : S5XX;
    }
    if (!c->is_stream) {
        c->reusable = 0;
        L->rtype = R_CTYPE;
        L->rdata = c->ctype.v;
        L->rlen = c->ctype.n;
        return PROTOCOL;
    }
    if (c->settled) return OK;
    L->rtype = c->line_len || c->n_data ? R_TRUNC_PENDING : R_TRUNC_CLEAN;
    L->rdata = "";
    L->rlen = 0;
    return TRUNCATED;
}

/* Feed one read to the HTTP reader of connection c (which has a request in flight). */
static void http_feed(Loop *L, Conn *c, const char *data, size_t n) {
    Err e = {0};
    size_t pos = 0;
    const char *buf = data;
    c->received += (int64_t)n;
    while (pos < n) {
        int st = c->ps;
        if (st == HEAD) {
            /* the header block: from data directly, or accumulated in c->buf */
            if (c->blen == 0) {
                if (data[pos] == '\n' || data[pos] == '\r') {
                    char rep[80];
                    repr_bytes(rep, sizeof rep, data + pos, n - pos < 16 ? n - pos : 16);
                    seterr(&e, PROTOCOL, "an empty line where a status line belongs: %s", rep);
                    goto error;
                }
                size_t end, next;
                if (!find_blank(data, pos, n, &end, &next)) {
                    if ((int64_t)(n - pos) > L->max_header) goto head_big;
                    if (grow((void **)&c->buf, &c->bcap, n - pos, 1)) goto head_big;
                    memcpy(c->buf, data + pos, n - pos);
                    c->blen = n - pos;
                    c->scan = c->blen >= 2 ? c->blen - 2 : 0;
                    return;
                }
                if ((int64_t)(end - pos) > L->max_header) goto head_big;
                int keep = 0;
                int r = on_head(L, c, data + pos, end - pos, &e, &keep);
                pos = next;
                if (r < 0) goto error;
                if (r == 1) { c->keep = keep; goto end_resp; }
                continue;
            }
            /* append what can still belong to a header block within the limit */
            size_t room = (size_t)L->max_header + 3 - c->blen;
            size_t take = n - pos < room ? n - pos : room;
            size_t old = c->blen;
            if (grow((void **)&c->buf, &c->bcap, old + take, 1)) goto head_big;
            memcpy(c->buf + old, data + pos, take);
            c->blen += take;
            size_t end, next;
            if (!find_blank(c->buf, c->scan, c->blen, &end, &next)) {
                if ((int64_t)c->blen > L->max_header) goto head_big;
                c->scan = c->blen >= 2 ? c->blen - 2 : 0;
                return;
            }
            if ((int64_t)end > L->max_header) goto head_big;
            int keep = 0;
            int r = on_head(L, c, c->buf, end, &e, &keep);
            pos = pos + (next - old); /* what follows the blank line, in data */
            c->blen = 0;
            c->scan = 0;
            if (r < 0) goto error;
            if (r == 1) { c->keep = keep; goto end_resp; }
            continue;
        } else if (st == BODY_LEN) {
            int64_t take = c->remaining < (int64_t)(n - pos) ? c->remaining : (int64_t)(n - pos);
            if (L->sse) body_segment(L, c, buf + pos, (size_t)take);
            pos += (size_t)take;
            c->remaining -= take;
            c->body += take;
            if (!c->remaining) goto end_resp;
        } else if (st == BODY_EOF) {
            c->body += (int64_t)(n - pos);
            if (c->body > L->max_body) {
                seterr(&e, TOO_LARGE, "body exceeds %lld bytes", (long long)L->max_body);
                goto error;
            }
            if (L->sse) body_segment(L, c, buf + pos, n - pos);
            pos = n;
        } else if (st == CHUNK_SIZE || st == TRAILER) {
            /* a line: from data, or completed in c->buf */
            const char *p = memchr(buf + pos, '\n', n - pos);
            const char *line;
            size_t ll;
            if (!p) {
                int64_t have = (int64_t)(c->blen + n - pos);
                if (st == CHUNK_SIZE && have > L->max_line) {
                    seterr(&e, TOO_LARGE, "chunk-size line exceeds %lld bytes", (long long)L->max_line);
                    goto error;
                }
                if (st == TRAILER && have + c->remaining > L->max_header) {
                    seterr(&e, TOO_LARGE, "trailer section exceeds %lld bytes", (long long)L->max_header);
                    goto error;
                }
                if (grow((void **)&c->buf, &c->bcap, c->blen + n - pos, 1)) return;
                memcpy(c->buf + c->blen, buf + pos, n - pos);
                c->blen += n - pos;
                return;
            }
            size_t seg = (size_t)(p - (buf + pos));
            if (c->blen) {
                if (grow((void **)&c->buf, &c->bcap, c->blen + seg, 1)) return;
                memcpy(c->buf + c->blen, buf + pos, seg);
                line = c->buf;
                ll = c->blen + seg;
            } else {
                line = buf + pos;
                ll = seg;
            }
            pos += seg + 1;
            c->blen = 0;
            if (st == CHUNK_SIZE) {
                if ((int64_t)ll > L->max_line) {
                    seterr(&e, TOO_LARGE, "chunk-size line exceeds %lld bytes", (long long)L->max_line);
                    goto error;
                }
                const char *semi = memchr(line, ';', ll);
                const char *t = line;
                size_t tl = semi ? (size_t)(semi - line) : ll;
                while (tl && (*t == ' ' || *t == '\t' || *t == '\r')) { t++; tl--; }
                while (tl && (t[tl - 1] == ' ' || t[tl - 1] == '\t' || t[tl - 1] == '\r')) tl--;
                int good = tl >= 1 && tl <= 15;
                int64_t size = 0;
                for (size_t k = 0; good && k < tl; k++) {
                    char ch = t[k];
                    int d = ch >= '0' && ch <= '9' ? ch - '0'
                            : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                            : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
                    if (d < 0) good = 0;
                    else size = size * 16 + d;
                }
                if (!good) {
                    char rep[80];
                    repr_bytes(rep, sizeof rep, line, ll < 32 ? ll : 32);
                    seterr(&e, PROTOCOL, "bad chunk-size line %s", rep);
                    goto error;
                }
                if (size == 0) {
                    c->ps = TRAILER;
                    c->remaining = 0;
                    continue;
                }
                if (c->body + size > L->max_body) {
                    seterr(&e, TOO_LARGE, "body exceeds %lld bytes", (long long)L->max_body);
                    goto error;
                }
                c->remaining = size;
                c->ps = CHUNK_DATA;
            } else {
                if (ll == 0 || (ll == 1 && line[0] == '\r')) goto end_resp;
                c->remaining += (int64_t)ll + 1;
                if (c->remaining > L->max_header) {
                    seterr(&e, TOO_LARGE, "trailer section exceeds %lld bytes", (long long)L->max_header);
                    goto error;
                }
                if (!memchr(line, ':', ll)) {
                    char rep[80];
                    repr_bytes(rep, sizeof rep, line, ll < 32 ? ll : 32);
                    seterr(&e, PROTOCOL, "malformed trailer field %s", rep);
                    goto error;
                }
            }
        } else if (st == CHUNK_DATA) {
            int64_t take = c->remaining < (int64_t)(n - pos) ? c->remaining : (int64_t)(n - pos);
            if (L->sse) body_segment(L, c, buf + pos, (size_t)take);
            pos += (size_t)take;
            c->remaining -= take;
            c->body += take;
            if (!c->remaining) c->ps = CHUNK_CRLF;
        } else if (st == CHUNK_CRLF) {
            char ch = buf[pos];
            if (c->blen) { /* a CR seen at the end of the previous read */
                c->blen = 0;
                if (ch != '\n') {
                    seterr(&e, PROTOCOL, "chunk data not followed by CRLF");
                    goto error;
                }
                pos++;
            } else if (ch == '\n') pos++;
            else if (ch == '\r') {
                if (pos + 1 >= n) {
                    c->buf = c->buf ? c->buf : malloc(16);
                    c->bcap = c->bcap ? c->bcap : 16;
                    c->buf[0] = '\r';
                    c->blen = 1;
                    return;
                }
                if (buf[pos + 1] != '\n') {
                    seterr(&e, PROTOCOL, "chunk data not followed by CRLF");
                    goto error;
                }
                pos += 2;
            } else {
                seterr(&e, PROTOCOL, "chunk data longer than its chunk-size");
                goto error;
            }
            c->ps = CHUNK_SIZE;
        } else {
            return; /* IDLE/DEAD: handled by the caller */
        }
        continue;
    end_resp: {
            /* The response is complete. Bytes after it belong to no request. */
            c->ps = IDLE;
            c->remaining = 0;
            if (L->sse && c->read_fail) { /* the stream failed first (openai_sse._Fail) */
                sse_fail(L, c);
                conn_close(L, c);
                return;
            }
            size_t extra = n - pos;
            if (extra || !c->keep) c->reusable = 0;
            int outcome;
            const char *reason = "";
            char rs[32];
            if (L->sse) outcome = sse_end(L, c);
            else if (c->mismatch[0]) {
                c->reusable = 0;
                outcome = PROTOCOL;
                reason = c->mismatch;
            } else {
                int s = c->status;
                outcome = s >= 200 && s < 400 ? OK : s >= 400 && s < 500 ? S4XX
                          : s >= 500 && s < 600 ? S5XX : PROTOCOL;
                if (outcome) {
                    snprintf(rs, sizeof rs, "HTTP %d", s);
                    reason = rs;
                }
            }
            complete(L, c, outcome, c->status, reason);
            if (extra) {
                stray(L, c, "with no request in flight", data + pos, extra);
                conn_close(L, c);
            } else if (usable(c)) ready(L, c, now_rel(L));
            else conn_close(L, c);
            return;
        }
    }
    return;
head_big:
    seterr(&e, TOO_LARGE, "header block exceeds %lld bytes", (long long)L->max_header);
error:
    c->ps = DEAD;
    c->blen = 0;
    if (L->sse) { /* a framing error drops the whole read (ResponseReader.feed raised) */
        L->evs.n = c->read_mark;
        L->blob.n = c->read_bmark;
    }
    fail(L, c, e.kind, e.reason);
    conn_close(L, c);
}

/* The peer closed with a request in flight: 1 when that completed the response. */
static int http_eof(Loop *L, Conn *c, Err *e) {
    int st = c->ps;
    c->ps = DEAD;
    if (st == BODY_EOF) {
        c->keep = 0;
        c->reusable = 0;
        int s = c->status, outcome;
        const char *reason = "";
        char rs[32];
        if (L->sse) outcome = sse_end(L, c);
        else if (c->mismatch[0]) { outcome = PROTOCOL; reason = c->mismatch; }
        else {
            outcome = s >= 200 && s < 400 ? OK : s >= 400 && s < 500 ? S4XX
                      : s >= 500 && s < 600 ? S5XX : PROTOCOL;
            if (outcome) { snprintf(rs, sizeof rs, "HTTP %d", s); reason = rs; }
        }
        complete(L, c, outcome, s, reason);
        return 1;
    }
    if (L->sse && st != HEAD && c->status && c->status != 200) {
        /* openai_sse: an error answer cut short is still its status error */
        c->reusable = 0;
        int outcome = sse_end(L, c);
        complete(L, c, outcome, c->status, "");
        return 1;
    }
    if (st == HEAD) {
        if (!c->received)
            return seterr(e, K_CLOSED, "connection closed before any response byte"), 0;
        seterr(e, TRUNCATED, "connection closed inside the header block (%lld bytes received)",
               (long long)c->received);
        return 0;
    }
    if (st == BODY_LEN) {
        seterr(e, TRUNCATED, "connection closed after %lld of %lld body bytes (Content-Length)",
               (long long)c->body, (long long)(c->body + c->remaining));
        return 0;
    }
    seterr(e, TRUNCATED, "connection closed inside a chunked body (%lld body bytes received, "
                         "no last chunk)", (long long)c->body);
    return 0;
}

/* ---- tcp:// framing (tcp.py) ---------------------------------------------------------- */

static void tcp_feed(Loop *L, Conn *c, const char *data, size_t n) {
    c->nbytes += (int64_t)n;
    if (c->first_len < 32) {
        size_t k = n < 32 - c->first_len ? n : 32 - c->first_len;
        memcpy(c->first + c->first_len, data, k);
        c->first_len += k;
    }
    size_t endpos = 0;
    int done = 0;
    if (L->resp_len >= 0) {
        int64_t need = L->resp_len - c->got;
        if ((int64_t)n >= need) {
            c->got = L->resp_len;
            endpos = (size_t)need;
            done = 1;
        } else c->got += (int64_t)n;
    } else {
        size_t dl = L->delim_len;
        /* the first delimiter in tail + data: one that starts in the tail, or in data */
        size_t tl = c->tail_len;
        int64_t at = -1;
        if (tl) {
            char join[512];
            size_t jn = tl;
            memcpy(join, c->tail, tl);
            size_t more = n < dl - 1 ? n : dl - 1;
            memcpy(join + jn, data, more);
            jn += more;
            void *m = dl <= jn ? memmem(join, jn, L->delim, dl) : NULL;
            if (m) at = (char *)m - join;
        }
        if (at < 0) {
            void *m = dl <= n ? memmem(data, n, L->delim, dl) : NULL;
            if (m) at = (int64_t)tl + ((const char *)m - data);
        }
        if (at >= 0) {
            size_t end = (size_t)at + dl; /* in tail+data coordinates */
            c->got += (int64_t)(end - tl);
            endpos = end - tl;
            done = 1;
        } else {
            c->got += (int64_t)n;
            if (c->got > L->max_body) {
                c->waiting = 0;
                char reason[MAX_REASON];
                snprintf(reason, sizeof reason, "no delimiter within %lld bytes", (long long)L->max_body);
                fail(L, c, TOO_LARGE, reason);
                conn_close(L, c);
                return;
            }
            /* keep the last dl-1 bytes of tail + data */
            if (dl > 1) {
                size_t keepn = dl - 1;
                char tmp[256];
                size_t all = tl + n;
                size_t from = all > keepn ? all - keepn : 0;
                size_t o = 0;
                for (size_t p = from; p < all && o < sizeof tmp; p++)
                    tmp[o++] = p < tl ? c->tail[p] : data[p - tl];
                memcpy(c->tail, tmp, o);
                c->tail_len = o;
            }
        }
    }
    if (!done) return;
    c->waiting = 0;
    size_t extra = n - endpos;
    if (extra) c->reusable = 0;
    int outcome = OK;
    char reason[MAX_REASON] = "";
    if (L->check_seq) {
        char want[32];
        int wl = snprintf(want, sizeof want, "%lld:", (long long)c->rid);
        if (c->first_len < (size_t)wl || memcmp(c->first, want, (size_t)wl)) {
            char rep[80];
            repr_bytes(rep, sizeof rep, c->first, c->first_len < 16 ? c->first_len : 16);
            outcome = PROTOCOL;
            c->reusable = 0;
            snprintf(reason, sizeof reason, "response %s not stamped for request %lld", rep,
                     (long long)c->rid);
        }
    }
    complete(L, c, outcome, 0, reason);
    if (extra) {
        stray(L, c, "after the complete response", data + endpos, extra);
        conn_close(L, c);
    } else if (usable(c)) ready(L, c, now_rel(L));
    else conn_close(L, c);
}

static int tcp_eof(Loop *L, Conn *c, Err *e) {
    if (!c->waiting) return 0;
    c->waiting = 0;
    if (!c->got) return seterr(e, K_CLOSED, "connection closed before any response byte"), 0;
    if (L->resp_len >= 0)
        seterr(e, TRUNCATED, "connection closed after %lld of %lld bytes", (long long)c->got,
               (long long)L->resp_len);
    else {
        char rep[80];
        repr_bytes(rep, sizeof rep, L->delim, L->delim_len);
        seterr(e, TRUNCATED, "connection closed after %lld bytes without the delimiter %s",
               (long long)c->got, rep);
    }
    return 0;
}

/* ---- the end of a stream (conn.py Connection._ended) ----------------------------------- */

/* The stream ended (err 0: EOF, else errno) with a request in flight: complete,
 * truncated, reset or stale. The caller closes the connection. */
static void conn_ended(Loop *L, Conn *c, int err) {
    if (c->rid < 0) return;
    Err e = {0};
    char reason[MAX_REASON + 80];
    int kind;
    if (err == 0) {
        int completed = L->tcp ? tcp_eof(L, c, &e) : http_eof(L, c, &e);
        if (completed) return;
        if (e.kind) {
            kind = e.kind;
            snprintf(reason, sizeof reason, "%s", e.reason);
        } else {
            kind = TRUNCATED;
            snprintf(reason, sizeof reason, "connection closed inside the response");
        }
    } else {
        kind = c->nbytes ? RESET : K_CLOSED;
        snprintf(reason, sizeof reason, "connection reset after %lld response bytes: [Errno %d] %s",
                 (long long)c->nbytes, err, strerror(err));
    }
    int64_t rid = c->rid;
    c->rid = -1;
    c->reusable = 0;
    if (kind == K_CLOSED) {
        if (c->served) {
            char r2[MAX_REASON + 80];
            if (err) snprintf(r2, sizeof r2, "reused connection (after %lld response(s)) closed "
                              "before any response byte: [Errno %d] %s", (long long)c->served,
                              err, strerror(err));
            else snprintf(r2, sizeof r2, "reused connection (after %lld response(s)) closed "
                          "before any response byte", (long long)c->served);
            on_stale(L, c, rid, r2);
            return;
        }
        kind = RESET;
        if (!err) snprintf(reason, sizeof reason, "connection closed before any response byte");
    }
    record(L, rid, kind, 0, c->t_send, now_rel(L), c->nbytes, reason);
}

/* One read's bytes (also what frame() feeds, without a socket). */
static void on_bytes(Loop *L, Conn *c, const char *buf, size_t r) {
    if (c->rid < 0) { /* bytes that no request asked for: the connection's error */
        stray(L, c, "with no request in flight", buf, r);
        conn_close(L, c);
        return;
    }
    if (L->tcp) tcp_feed(L, c, buf, r);
    else if (L->sse) { /* one timestamp per read: every event in it arrived then (the
                          * kernel's receive time, so a loop that reads late times each
                          * chunk when it came; the read's own time without one) */
        c->nbytes += (int64_t)r;
        c->t_read = c->t_arrive != NO_TIME ? c->t_arrive : now_rel(L);
        c->read_fail = 0;
        c->read_mark = L->evs.n;
        c->read_bmark = L->blob.n;
        http_feed(L, c, buf, r);
        if (c->state == C_OPEN && c->rid >= 0 && c->read_fail) {
            sse_fail(L, c);
            conn_close(L, c);
        }
    } else {
        c->nbytes += (int64_t)r;
        http_feed(L, c, buf, r);
    }
}

/* When the kernel received the last bytes recvmsg() returned, on this loop's clock: the
 * stamp is CLOCK_REALTIME (sockets give no other), moved onto the monotonic clock by
 * real_off, so a read costs no clock reading (it took two here: a review counted them).
 * NO_TIME without a stamp. Never after the record's end (stamp_end). */
static int64_t arrived(Loop *L, struct msghdr *m) {
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(m); cm; cm = CMSG_NXTHDR(m, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_TIMESTAMPNS) continue;
        struct timespec k;
        memcpy(&k, CMSG_DATA(cm), sizeof k);
        return (int64_t)k.tv_sec * 1000000000LL + k.tv_nsec - L->real_off - L->start_ns;
    }
    return NO_TIME;
}

/* One read's ciphertext: what it decrypts to is framed as a plaintext read would be (it
 * arrived when the read did). 1 when the connection is no longer open. */
static int tls_feed(Loop *L, Conn *c, const char *buf, size_t n) {
    char reason[MAX_REASON];
    BIO_write(SSL_get_rbio(c->ssl), buf, (int)n);
    for (;;) {
        ERR_clear_error();
        int r = SSL_read(c->ssl, L->pbuf, READ_CHUNK);
        if (r > 0) {
            on_bytes(L, c, L->pbuf, (size_t)r);
            if (c->state != C_OPEN) return 1;
            continue;
        }
        int err = SSL_get_error(c->ssl, r);
        if (err == SSL_ERROR_WANT_READ) break;
        if (err == SSL_ERROR_ZERO_RETURN) { /* close_notify: the end of the stream */
            c->eof = 1;
            conn_ended(L, c, 0);
        } else if (err == SSL_ERROR_SSL) { /* an alert (TLS 1.3: a refused client cert) */
            tls_why(L, c, err, reason, sizeof reason);
            fail(L, c, TLS_K, reason);
        } else {
            ERR_clear_error();
            conn_ended(L, c, EPROTO);
        }
        conn_close(L, c);
        return 1;
    }
    if (c->draining) return 0; /* (send_failed reads on; nothing more goes out) */
    if (tls_push(L, c) < 0) {
        send_failed(L, c, errno);
        return 1;
    }
    if (c->out_off < c->out_len) flush_out(L, c); /* a write that had to read first */
    return c->state != C_OPEN;
}

static void on_readable(Loop *L, Conn *c) {
    char *buf = L->rbuf;
    union { char b[CMSG_SPACE(sizeof(struct timespec)) * 2]; struct cmsghdr align; } ctl;
    for (;;) {
        if (L->sse && ev_bytes(L) >= EV_HARD) return; /* read once the backlog is taken */
        struct iovec io = {.iov_base = buf, .iov_len = READ_CHUNK};
        struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl.b,
                           .msg_controllen = sizeof ctl.b};
        ssize_t r = recvmsg(c->fd, &m, 0);
        if (r > 0) {
            c->t_arrive = arrived(L, &m);
            if (c->ssl) {
                if (tls_feed(L, c, buf, (size_t)r)) return;
            } else {
                on_bytes(L, c, buf, (size_t)r);
                if (c->state != C_OPEN) return;
            }
            if (r < READ_CHUNK) return; /* drained (edge cases come back via epoll) */
            continue;
        }
        if (r == 0) {
            c->eof = 1;
            conn_ended(L, c, 0);
            conn_close(L, c);
            return;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        conn_ended(L, c, errno);
        conn_close(L, c);
        return;
    }
}

/* A send failed (errno err) with a request in flight. The server may have answered before
 * it reset the connection (RFC 9112 9.5: a client keeps reading while it sends; a server
 * that answers an upload early and resets, or a TLS 1.3 server's alert after our
 * handshake was done): what the kernel already holds is read and framed first, so a
 * response that arrived whole is ok and an alert is tls; only a request still in flight
 * after that ends with err (reset). The connection goes either way. (Linux keeps the
 * bytes that came before a RST readable; the send took the error, so the reads end with
 * an EOF after them.) */
static void send_failed(Loop *L, Conn *c, int err) {
    c->reusable = 0;
    c->draining = 1;
    c->out_off = c->out_len; /* nothing more goes out */
    c->tx.n = c->tx_off = 0;
    char *buf = L->rbuf;
    union { char b[CMSG_SPACE(sizeof(struct timespec)) * 2]; struct cmsghdr align; } ctl;
    while (c->state == C_OPEN && c->rid >= 0) {
        struct iovec io = {.iov_base = buf, .iov_len = READ_CHUNK};
        struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl.b,
                           .msg_controllen = sizeof ctl.b};
        ssize_t r = recvmsg(c->fd, &m, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* the end, nothing more yet, or the error itself */
        c->t_arrive = arrived(L, &m);
        if (c->ssl) tls_feed(L, c, buf, (size_t)r);
        else on_bytes(L, c, buf, (size_t)r);
    }
    if (c->state != C_OPEN) return; /* framed to its end (complete, failed): closed */
    conn_ended(L, c, err);
    conn_close(L, c);
}

/* A connecting socket reported an event: 1 when its connect failed (counted and
 * closed), 0 when it has not. */
static int connect_error(Loop *L, Conn *c, int initial) {
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (!err) return 0;
    char reason[MAX_REASON];
    if (err == ECONNRESET || err == EPIPE) {
        /* The handshake was done (a refusal is ECONNREFUSED) and the server reset the
         * connection before anything went out: a reset (tls.dial's words), not connect. */
        if (L->tls) {
            snprintf(reason, sizeof reason, "TLS: the server closed the connection during the "
                     "handshake (%s)", strerror(err));
            attempt_failed(L, c, TLS_K, reason, initial);
        } else {
            snprintf(reason, sizeof reason, "connection reset before its first request was "
                     "written: [Errno %d] %s", err, strerror(err));
            attempt_failed(L, c, RESET, reason, initial);
        }
        return 1;
    }
    snprintf(reason, sizeof reason, "[Errno %d] %s", err, strerror(err));
    connect_failed(L, c, reason, initial);
    return 1;
}

static void on_event(Loop *L, Conn *c, uint32_t events) {
    if (c->state == C_CONNECTING && c->hs) {
        if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) tls_hs_readable(L, c);
        else if (events & EPOLLOUT) tls_step(L, c); /* the rest of its output */
        return;
    }
    if (c->state == C_CONNECTING) {
        if (!connect_error(L, c, 0) && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
            connected(L, c);
        }
        return;
    }
    if (c->state != C_OPEN) return;
    if ((events & EPOLLOUT) && out_pending(c)) {
        flush_out(L, c);
        if (c->state != C_OPEN) return;
        if (!out_pending(c)) epoll_set(L, c, EPOLLIN);
    }
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) on_readable(L, c);
}

/* ---- dispatch and time-outs ------------------------------------------------------------ */

static void dispatch(Loop *L) {
    if (L->stopping || L->ended) return;
    int64_t now = now_rel(L);
    while (L->next_i < L->n && L->times[L->next_i] <= now) {
        int64_t i = L->next_i++;
        L->disp[i] = now;
        Conn *c = NULL;
        while (L->n_idle) {
            Conn *x = &L->conns[L->idle[--L->n_idle]];
            x->idle = 0;
            if (usable(x)) { c = x; break; }
        }
        if (c) send_req(L, c, i, now);
        else {
            q_push_back(L, i);
            if (grow((void **)&L->queued.v, &L->queued.cap, L->queued.n + 1, sizeof(int64_t)) == 0)
                L->queued.v[L->queued.n++] = i;
            if (L->q_len > L->n_connecting && !L->stopping) maybe_open(L);
        }
        now = now_rel(L); /* each dispatch time is its own */
    }
    check_finished(L);
}

static void sweep(Loop *L) {
    int64_t now = now_rel(L);
    int64_t limit = now - L->timeout_ns; /* requests intended before this have timed out */
    char reason[MAX_REASON];
    while (L->q_len) {
        int64_t rid = L->q[L->q_head];
        if (L->done[rid]) { q_pop_front(L); continue; }
        if (L->times[rid] > limit) break;
        q_pop_front(L);
        snprintf(reason, sizeof reason, "still waiting for a connection after %g s", L->timeout_s);
        record(L, rid, TIMEOUT, 0, NO_TIME, L->times[rid] + L->timeout_ns, 0, reason);
    }
    for (int k = 0; k < L->cap; k++) {
        Conn *c = &L->conns[k];
        if (c->state == C_CONNECTING && c->t_conn <= now - L->timeout_ns) {
            attempt_timed_out(L, c);
            continue;
        }
        if (c->state != C_OPEN || c->rid < 0) continue;
        int64_t rid = c->rid;
        if (L->times[rid] > limit) continue;
        snprintf(reason, sizeof reason, "no complete response within %g s (%s response)",
                 L->timeout_s, c->nbytes ? "partial" : "no");
        int64_t nb = c->nbytes, ts = c->t_send;
        c->rid = -1;
        conn_close(L, c); /* HTTP/1.1 cannot cancel a request: the connection goes */
        record(L, rid, TIMEOUT, 0, ts, L->times[rid] + L->timeout_ns, nb, reason);
    }
    check_finished(L);
}

/* Requests whose stream Python found failed (its JSON: a malformed chunk, an error object,
 * past --max-tokens-per-stream) and that are still in flight: the connection goes now,
 * as the Python engine drops it (their outcome is Python's; this record is replaced). */
static void do_cuts(Loop *L) {
    for (size_t i = 0; i < L->cuts.n; i++) {
        int64_t rid = L->cuts.v[i];
        if (rid < 0 || rid >= L->n || L->done[rid]) continue;
        for (int k = 0; k < L->cap; k++) {
            Conn *c = &L->conns[k];
            if (c->state == C_OPEN && c->rid == rid) {
                fail(L, c, PROTOCOL, "cut: its stream failed");
                conn_close(L, c);
                break;
            }
        }
    }
    L->cuts.n = 0;
}

/* A timed wake-up returned ``late`` ns after it was due: keep the last WAKE_N, and every
 * 16th the margin to poll for becomes the same quantile of those kept (from 64 on, the
 * wake_q+1st; the default 63rd: an outlier, another task taking the core, does not set it). */
static void wake_seen(Loop *L, int64_t late) {
    L->wake_late[L->wake_k] = late > 0 ? late : 0;
    L->wake_k = (L->wake_k + 1) % WAKE_N;
    if (++L->wake_seen % 16) return;
    int n = L->wake_seen < WAKE_N ? L->wake_seen : WAKE_N;
    int64_t v[WAKE_N];
    memcpy(v, L->wake_late, (size_t)n * sizeof v[0]);
    for (int i = 1; i < n; i++) /* insertion sort: at most 64 values, every 16 wake-ups */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            int64_t t = v[j]; v[j] = v[j - 1]; v[j - 1] = t;
        }
    int at = n * (L->wake_q + 1) / WAKE_N - 1;
    L->spin_learnt = v[at < 0 ? 0 : at];
}

/* How early to wake before the next due time and poll from there: the learnt margin, at
 * most SPIN_MAX and at most 1/spin_div of the gap since the request before (so polling
 * takes at most about that share of a core at any rate). No floor: waking earlier than
 * the wake-ups need is CPU spent for nothing (poll_ns, the floor this once had, cost
 * 10 us a request at 30k/s, where an eighth of the gap is 4 us). */
static int64_t spin_for(Loop *L) {
    int64_t s = L->spin_learnt < SPIN_MAX ? L->spin_learnt : SPIN_MAX;
    int64_t i = L->next_i > 0 ? L->next_i : 1; /* (the first: the gap after it) */
    if (i < L->n && L->spin_div > 0) {
        int64_t budget = (L->times[i] - L->times[i - 1]) / L->spin_div;
        if (s > budget) s = budget;
    }
    int64_t most = s > L->poll_ns ? s : L->poll_ns;
    if (most > L->spin_max_used) L->spin_max_used = most;
    return s;
}

/* Wait for events of epoll set ``ep`` until abs time ``until`` (relative ns), or a wake-up. */
static int wait_events(Loop *L, int ep, struct epoll_event *evs, int max, int64_t until) {
    int64_t d = until - now_rel(L);
    if (d < 0) d = 0;
    struct timespec ts = {.tv_sec = d / 1000000000LL, .tv_nsec = d % 1000000000LL};
    int r = epoll_pwait2(ep, evs, max, &ts, NULL);
    if (r < 0 && errno == ENOSYS) {
        L->precise = 0;
        r = epoll_wait(ep, evs, max, (int)((d + 999999) / 1000000));
    }
    L->waits++;
    if (r > 0 && !(r == 1 && evs[0].data.u64 == EV_WAKE)) L->woken++;
    if (r == 0 && d > 0) wake_seen(L, now_rel(L) - until);
    return r;
}

static void dispatch(Loop *L);

static void handle(Loop *L, struct epoll_event *evs, int r) {
    for (int k = 0; k < r; k++) {
        /* a request due while a long batch is read goes now, not after the batch (256
         * reads of ~5 us each); every 8th event, one clock read */
        if ((k & 7) == 7 && !L->ended && L->next_i < L->n && L->times[L->next_i] <= now_rel(L))
            dispatch(L);
        if (evs[k].data.u64 == EV_WAKE) {
            uint64_t v;
            if (read(L->wake_fd, &v, sizeof v) < 0) { /* nothing to drain */ }
            continue;
        }
        on_event(L, &L->conns[evs[k].data.u64], evs[k].events);
    }
}

/* A short scheduler slice for this thread (EEVDF custom slices, Linux 6.12+): a woken
 * task with a shorter slice preempts the running one (PREEMPT_SHORT), so on a shared
 * core a due request waits ~100 us for the CPU at most instead of the default slice
 * (~3 ms). Only this thread, and only its slice: its nice value stays. Older kernels
 * refuse or ignore it (nothing else changes). */
struct tg_sched_attr {
    uint32_t size, sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
    uint32_t sched_util_min, sched_util_max;
};

static int short_slice(uint64_t ns) {
#ifdef SYS_sched_setattr
    /* a slice is a CFS setting: setting it would demote a real-time loop to SCHED_OTHER */
    if (sched_getscheduler(0) != SCHED_OTHER) return -1;
    struct tg_sched_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.sched_policy = 0; /* SCHED_OTHER */
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    if (errno) return -1;
    a.sched_nice = nice;
    a.sched_runtime = ns;
    return (int)syscall(SYS_sched_setattr, 0, &a, 0);
#else
    (void)ns;
    return -1;
#endif
}

/* ---- the Python type ------------------------------------------------------------------- */

static void Loop_dealloc(Loop *L) {
    if (L->conns) {
        for (int k = 0; k < L->cap; k++) {
            Conn *c = &L->conns[k];
            if (c->fd >= 0 && c->state != C_FREE) close(c->fd);
            free(c->buf);
            free(c->stamped);
            free(c->tail);
            free(c->line.v); free(c->ev.v); free(c->ctype.v); free(c->ebody.v);
            free(c->seg_why.v); free(c->fail_why.v);
            if (c->ssl) SSL_free(c->ssl);
            free(c->tx.v);
        }
    }
    if (L->tls) SSL_CTX_free(L->tls);
    if (L->keylog) fclose(L->keylog);
    free(L->tls_name); free(L->pbuf); free(L->conn_ns.v); free(L->hs_ns.v);
    if (L->ep >= 0) close(L->ep);
    if (L->ep_wake >= 0) close(L->ep_wake);
    if (L->wake_fd >= 0) close(L->wake_fd);
    free(L->conns); free(L->idle); free(L->free_slots); free(L->times); free(L->done);
    free(L->retried); free(L->disp); free(L->q); free(L->req); free(L->delim);
    free(L->recs.v); free(L->queued.v); free(L->fixes.v); free(L->rbuf); free(L->scratch);
    free(L->reqs); free(L->req_off); free(L->evs.v); free(L->blob.v); free(L->cuts.v);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->ev_cv);
    Py_TYPE(L)->tp_free((PyObject *)L);
}

/* SSLKEYLOGFILE, as the Python engine's context writes it (_ssl.c's keylog callback) */
static void tls_keylog(const SSL *ssl, const char *line) {
    Loop *L = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    if (L && L->keylog) {
        fprintf(L->keylog, "%s\n", line);
        fflush(L->keylog);
    }
}

/* What the Python engine's SSLContext sets, copied from it (tls.ContextSettings, read from
 * the context tls.client_context made, so both engines offer the same client hello and
 * verify alike). Python has checked the files already, so a failure here is unexpected:
 * -1 with a ValueError set. */
typedef struct {
    const char *cafile, *certfile, *keyfile, *name, *ciphers, *ciphersuites, *keylog;
    int verify, check_hostname, min_version, max_version, common_name, pha;
    unsigned long long options;
    unsigned long verify_flags;
    Py_buffer *alpn;
} TlsSettings;

static int tls_context(Loop *L, const TlsSettings *t) {
    const char *what = "a TLS context";
    ERR_clear_error();
    SSL_CTX *x = L->tls = SSL_CTX_new(TLS_client_method());
    if (!x) goto bad;
    SSL_CTX_set_app_data(x, L);
    SSL_CTX_clear_options(x, SSL_CTX_get_options(x));
    SSL_CTX_set_options(x, (uint64_t)t->options);
    what = "the protocol versions";
    if (SSL_CTX_set_min_proto_version(x, t->min_version) != 1 ||
        SSL_CTX_set_max_proto_version(x, t->max_version) != 1) goto bad;
    what = "the cipher list";
    /* an empty TLS 1.2 list is valid when only TLS 1.3 suites are offered */
    if ((*t->ciphers ? SSL_CTX_set_cipher_list(x, t->ciphers) : 1) != 1 ||
        SSL_CTX_set_ciphersuites(x, t->ciphersuites) != 1) goto bad;
    X509_VERIFY_PARAM *vp = SSL_CTX_get0_param(x);
    X509_VERIFY_PARAM_clear_flags(vp, X509_VERIFY_PARAM_get_flags(vp));
    X509_VERIFY_PARAM_set_flags(vp, t->verify_flags);
    /* _ssl.c's host flags: no partial wildcards, the subject's CN only if the context
     * allows it (hostname_checks_common_name) */
    X509_VERIFY_PARAM_set_hostflags(vp, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS |
        (t->common_name ? 0 : X509_CHECK_FLAG_NEVER_CHECK_SUBJECT));
    SSL_CTX_set_post_handshake_auth(x, t->pha);
    L->tls_verify = t->verify;
    L->tls_check_host = t->check_hostname;
    if (!t->verify) SSL_CTX_set_verify(x, SSL_VERIFY_NONE, NULL);
    else {
        SSL_CTX_set_verify(x, SSL_VERIFY_PEER, NULL);
        what = t->cafile ? t->cafile : "the system's CAs";
        if ((t->cafile ? SSL_CTX_load_verify_locations(x, t->cafile, NULL)
                       : SSL_CTX_set_default_verify_paths(x)) != 1) goto bad;
    }
    if (t->certfile) {
        what = t->certfile;
        if (SSL_CTX_use_certificate_chain_file(x, t->certfile) != 1) goto bad;
        what = t->keyfile ? t->keyfile : t->certfile;
        if (SSL_CTX_use_PrivateKey_file(x, what, SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(x) != 1) goto bad;
    }
    what = "ALPN";
    if (t->alpn->buf && t->alpn->len &&
        SSL_CTX_set_alpn_protos(x, t->alpn->buf, (unsigned)t->alpn->len) != 0) goto bad;
    if (t->keylog && *t->keylog) {
        what = t->keylog;
        if (!(L->keylog = fopen(t->keylog, "a"))) {
            PyErr_Format(PyExc_ValueError, "TLS: %s: %s", what, strerror(errno));
            return -1;
        }
        SSL_CTX_set_keylog_callback(x, tls_keylog);
    }
    if (t->name && *t->name) {
        unsigned char ip[16];
        if (!(L->tls_name = strdup(t->name))) goto bad;
        L->tls_ip = inet_pton(AF_INET, t->name, ip) == 1 || inet_pton(AF_INET6, t->name, ip) == 1;
    }
    if (!(L->pbuf = malloc(READ_CHUNK))) goto bad;
    return 0;
bad:;
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    PyErr_Format(PyExc_ValueError, "TLS: %s: %s", what, r ? r : "out of memory");
    ERR_clear_error();
    return -1;
}

static int Loop_init(Loop *L, PyObject *args, PyObject *kw) {
    static char *names[] = {"kind", "family", "address", "port", "request", "times_ns",
                            "first_measured", "max_connections", "timeout_s", "max_header",
                            "max_line", "max_body", "delimiter", "response_length",
                            "retry_stale", "check_seq", "requests", "request_offsets",
                            "max_event", "sse_max_line", "tls", "cafile", "certfile",
                            "keyfile", "verify", "check_hostname", "server_name", "alpn",
                            "ciphers", "ciphersuites", "min_version", "max_version", "options",
                            "verify_flags", "common_name", "post_handshake_auth", "keylog",
                            NULL};
    const char *kind, *address;
    int family, port, cap, retry_stale = 0, check_seq = 0, tls = 0;
    Py_buffer reqb, times, reqs = {0}, offs = {0}, alpn = {0};
    TlsSettings ts = {.ciphers = "", .ciphersuites = "", .common_name = 1, .alpn = &alpn};
    long long first_measured, max_header, max_line, max_body, resp_len = -1;
    long long max_event = 16 << 20, sse_max_line = 1 << 20;
    double timeout_s;
    PyObject *delim_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sisiy*y*LidLLL|OLppy*y*LLpzzzppzy*ssiiKkppz",
                                     names,
                                     &kind, &family, &address, &port, &reqb, &times,
                                     &first_measured, &cap, &timeout_s, &max_header, &max_line,
                                     &max_body, &delim_obj, &resp_len, &retry_stale, &check_seq,
                                     &reqs, &offs, &max_event, &sse_max_line, &tls, &ts.cafile,
                                     &ts.certfile, &ts.keyfile, &ts.verify, &ts.check_hostname,
                                     &ts.name, &alpn, &ts.ciphers, &ts.ciphersuites,
                                     &ts.min_version, &ts.max_version, &ts.options,
                                     &ts.verify_flags, &ts.common_name, &ts.pha, &ts.keylog))
        return -1;
    int rc = -1;
    L->ep = L->wake_fd = L->ep_wake = -1;
    /* priority inheritance: the recorder thread that takes() runs below the loop thread, and
     * a real-time loop (chrt) must not wait behind it while it is preempted holding mu */
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setprotocol(&ma, PTHREAD_PRIO_INHERIT);
    pthread_mutex_init(&L->mu, &ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&L->ev_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutexattr_destroy(&ma);
    L->tcp = !strcmp(kind, "tcp");
    L->sse = !strcmp(kind, "openai");
    L->max_event = max_event;
    L->sse_max_line = sse_max_line;
    L->family = family;
    memset(&L->addr, 0, sizeof L->addr);
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&L->addr;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, address, &a->sin6_addr) != 1) goto bad_addr;
        L->addrlen = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&L->addr;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        if (inet_pton(AF_INET, address, &a->sin_addr) != 1) goto bad_addr;
        L->addrlen = sizeof *a;
    }
    if (cap < 1 || times.len % 8) {
        PyErr_SetString(PyExc_ValueError, "max_connections >= 1 and int64 times");
        goto out;
    }
    L->req_len = (size_t)reqb.len;
    L->req = malloc(L->req_len + 1);
    memcpy(L->req, reqb.buf, L->req_len);
    L->head_req = L->req_len >= 5 && !memcmp(L->req, "HEAD ", 5);
    if (L->sse) { /* each request its own bytes: offsets[i]..offsets[i+1] of requests */
        L->head_req = 0;
        check_seq = 0; /* (openai_sse stamps nothing) */
        int64_t nreq = (int64_t)(times.len / 8);
        if (!reqs.buf || !offs.buf || offs.len != (nreq + 1) * 8) {
            PyErr_SetString(PyExc_ValueError, "an openai loop needs requests and n + 1 offsets");
            goto out;
        }
        L->reqs = malloc((size_t)reqs.len + 1);
        L->req_off = malloc((size_t)offs.len);
        if (!L->reqs || !L->req_off) { PyErr_NoMemory(); goto out; }
        memcpy(L->reqs, reqs.buf, (size_t)reqs.len);
        memcpy(L->req_off, offs.buf, (size_t)offs.len);
        for (int64_t i = 0; i < nreq; i++)
            if (L->req_off[i] < 0 || L->req_off[i] > L->req_off[i + 1] ||
                L->req_off[i + 1] > (int64_t)reqs.len) {
                PyErr_SetString(PyExc_ValueError, "request offsets out of order");
                goto out;
            }
    } else if (!L->tcp) {
        void *m = memmem(L->req, L->req_len, "\r\n\r\n", 4);
        if (!m) {
            PyErr_SetString(PyExc_ValueError, "an HTTP request ends its header block with CRLF CRLF");
            goto out;
        }
        L->req_cut = (size_t)((char *)m - L->req) + 2;
    }
    L->resp_len = resp_len;
    if (delim_obj != Py_None) {
        char *d;
        Py_ssize_t dl;
        if (PyBytes_AsStringAndSize(delim_obj, &d, &dl) < 0) goto out;
        if (dl < 1 || dl > 255) {
            PyErr_SetString(PyExc_ValueError, "a delimiter of 1 to 255 bytes");
            goto out;
        }
        L->delim = malloc((size_t)dl);
        memcpy(L->delim, d, (size_t)dl);
        L->delim_len = (size_t)dl;
    }
    if (L->tcp && (L->delim == NULL) == (resp_len < 0)) {
        PyErr_SetString(PyExc_ValueError, "exactly one of a delimiter and a response length");
        goto out;
    }
    L->max_header = max_header;
    L->max_line = max_line;
    L->max_body = max_body;
    L->timeout_s = timeout_s;
    L->timeout_ns = (int64_t)(timeout_s * 1e9);
    L->first_measured = first_measured;
    L->retry_stale = retry_stale;
    L->check_seq = check_seq;
    L->n = (int64_t)(times.len / 8);
    size_t nn = (size_t)(L->n ? L->n : 1);
    L->times = malloc(nn * 8);
    memcpy(L->times, times.buf, (size_t)times.len);
    L->done = touched(nn);
    L->retried = touched(nn);
    L->disp = touched(nn * 8);
    L->q_cap = (int64_t)nn + 1;
    L->q = touched((size_t)L->q_cap * 8);
    L->cap = cap;
    L->conns = calloc((size_t)cap, sizeof(Conn));
    L->idle = malloc((size_t)cap * sizeof(int));
    L->free_slots = malloc((size_t)cap * sizeof(int));
    L->rbuf = malloc(READ_CHUNK);
    if (!L->times || !L->done || !L->retried || !L->disp || !L->q || !L->conns || !L->idle ||
        !L->free_slots || !L->rbuf) {
        PyErr_NoMemory();
        goto out;
    }
    for (int k = 0; k < cap; k++) {
        L->conns[k].fd = -1;
        L->conns[k].rid = -1;
        L->free_slots[k] = cap - 1 - k;
        if (L->tcp && L->delim_len > 1) L->conns[k].tail = malloc(L->delim_len);
    }
    L->n_free = cap;
    L->ep = epoll_create1(EPOLL_CLOEXEC);
    L->ep_wake = epoll_create1(EPOLL_CLOEXEC);
    L->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (L->ep < 0 || L->ep_wake < 0 || L->wake_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto out;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV_WAKE};
    epoll_ctl(L->ep, EPOLL_CTL_ADD, L->wake_fd, &ev);
    epoll_ctl(L->ep_wake, EPOLL_CTL_ADD, L->wake_fd, &ev);
    if (tls && tls_context(L, &ts) < 0)
        goto out;
    L->precise = 1;
    L->wake_q = WAKE_Q;
    L->spin_div = 8;
    real_offset(L); /* (prepare's reads; run() takes it again at the start) */
    rc = 0;
    goto out;
bad_addr:
    PyErr_Format(PyExc_ValueError, "not a numeric address: %s", address);
out:
    PyBuffer_Release(&reqb);
    PyBuffer_Release(&times);
    if (reqs.buf) PyBuffer_Release(&reqs);
    if (offs.buf) PyBuffer_Release(&offs);
    if (alpn.buf) PyBuffer_Release(&alpn);
    return rc;
}

/* prepare(n, deadline_s): open n connections (failures counted, not fatal) and wait until
 * each is open or failed, at most timeout. */
static PyObject *Loop_prepare(Loop *L, PyObject *args) {
    int want;
    if (!PyArg_ParseTuple(args, "i", &want)) return NULL;
    if (want > L->cap) want = L->cap;
    struct epoll_event evs[64];
    Py_BEGIN_ALLOW_THREADS
    L->start_ns = clock_ns();
    pthread_mutex_lock(&L->mu);
    for (int k = 0; k < want; k++) {
        L->n_connecting++;
        open_conn(L, 1);
    }
    int64_t until = L->timeout_ns;
    while (L->n_connecting > 0) {
        int64_t now = now_rel(L);
        if (now >= until) {
            for (int k = 0; k < L->cap; k++) {
                Conn *c = &L->conns[k];
                if (c->state == C_CONNECTING) attempt_timed_out(L, c);
            }
            break;
        }
        pthread_mutex_unlock(&L->mu);
        int r = wait_events(L, L->ep, evs, 64, until);
        pthread_mutex_lock(&L->mu);
        if (r > 0) {
            for (int k = 0; k < r; k++) {
                if (evs[k].data.u64 == EV_WAKE) continue;
                Conn *c = &L->conns[evs[k].data.u64];
                if (c->state == C_CONNECTING && !c->hs) {
                    if (!connect_error(L, c, 1)) connected(L, c);
                } else on_event(L, c, evs[k].events);
            }
        }
    }
    pthread_mutex_unlock(&L->mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* run(start_ns, poll_ns, slice_ns, wake_q, spin_div, defer_ns, coalesce_ns): the whole
 * schedule, without the GIL; returns when every request ended, or stop() was called. Call
 * it from a thread of its own; take() meanwhile. poll_ns: a due time this close is polled
 * for, never slept to; wake_q (0-63) and spin_div: the margin spin_for learns and its share
 * of the gap; defer_ns and coalesce_ns: see the fields. */
static PyObject *Loop_run(Loop *L, PyObject *args) {
    long long start_ns, poll_ns = 0, slice_ns = 0, defer_ns = 0, coalesce_ns = 0;
    int wake_q = WAKE_Q, spin_div = 8;
    if (!PyArg_ParseTuple(args, "L|LLiiLL", &start_ns, &poll_ns, &slice_ns, &wake_q,
                          &spin_div, &defer_ns, &coalesce_ns))
        return NULL;
    if (wake_q < 0 || wake_q >= WAKE_N || spin_div < 0 || poll_ns < 0 || defer_ns < 0 ||
        coalesce_ns < 0) {
        PyErr_SetString(PyExc_ValueError, "run: wake_q must be 0-63, spin_div, poll_ns, "
                        "defer_ns and coalesce_ns >= 0");
        return NULL;
    }
    L->defer_ns = defer_ns;
    L->coalesce_ns = coalesce_ns;
    L->slice_ns = slice_ns;
    L->poll_ns = poll_ns;
    L->wake_q = wake_q;
    L->spin_div = spin_div;
    if (L->n > 1) { /* practice at the mean gap of the first 64 */
        int64_t k = L->n - 1 < 64 ? L->n - 1 : 64;
        int64_t g = (L->times[k] - L->times[0]) / k;
        L->practice_ns = g < PRACTICE_MIN ? PRACTICE_MIN : g > PRACTICE_MAX ? PRACTICE_MAX : g;
    } else L->practice_ns = PRACTICE_MAX;
    struct epoll_event evs[256];
    Py_BEGIN_ALLOW_THREADS
    /* this thread only: a timer wakes when asked, not up to 50 us later (timer slack) */
    int old_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);
    if (L->slice_ns > 0) L->short_slice = short_slice((uint64_t)L->slice_ns) == 0;
    pthread_mutex_lock(&L->mu);
    L->start_ns = start_ns;
    real_offset(L);
    L->running = 1;
    /* time-out sweep period: engine._sweep's min(10 ms, timeout / 10) */
    int64_t sweep_every = L->timeout_ns / 10 < 10000000 ? L->timeout_ns / 10 : 10000000;
    if (sweep_every < 100000) sweep_every = 100000;
    int64_t next_sweep = 0;
    check_finished(L);
    while (!L->finished && !L->stopping) {
        if (L->cuts.n) do_cuts(L);
        dispatch(L);
        int64_t now = now_rel(L);
        if (now >= next_sweep) {
            if (L->defer_ns > 0) { /* replies left to wait are read before any times out */
                int r = epoll_wait(L->ep, evs, 256, 0);
                if (r > 0) handle(L, evs, r);
            }
            sweep(L);
            real_offset(L);
            next_sweep = now + sweep_every;
        }
        if (L->finished || L->stopping) break;
        int64_t until = next_sweep;
        int have_due = !L->ended && L->next_i < L->n;
        if (have_due && L->times[L->next_i] + L->coalesce_ns <= until)
            until = L->times[L->next_i] + L->coalesce_ns;
        else have_due = 0; /* the sweep comes first: sleep to it, no polling */
        if (!L->ended && L->next_i == 0 && L->n > 0 && L->wake_seen < WAKE_N &&
            L->times[0] - now > L->practice_ns + SPIN_MAX && now + L->practice_ns < until) {
            /* the lead before the first request: a practice wake-up to learn from */
            until = now + L->practice_ns;
            have_due = 0;
            L->practiced++;
        }
        int64_t spin = have_due ? spin_for(L) : 0;
        int64_t poll = spin > L->poll_ns ? spin : L->poll_ns;
        if (L->sse && ev_bytes(L) >= EV_HARD) {
            /* the backlog is full: sleep (sends still go when due) until it is taken */
            int64_t t_pause = now_rel(L);
            if (!L->pausing) L->pauses++;
            L->pausing = 1;
            int64_t d = until - spin - t_pause;
            if (d > 0) {
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                int64_t abs_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec + d;
                ts.tv_sec = abs_ns / 1000000000LL;
                ts.tv_nsec = abs_ns % 1000000000LL;
                pthread_cond_timedwait(&L->ev_cv, &L->mu, &ts);
            }
            L->paused_ns += now_rel(L) - t_pause;
            continue;
        }
        L->pausing = 0;
        pthread_mutex_unlock(&L->mu);
        int r;
        if (have_due && until - now_rel(L) <= poll) {
            /* the last microseconds: poll instead of sleeping, never past the due time */
            do r = epoll_wait(L->ep, evs, 256, 0);
            while (r == 0 && now_rel(L) < until);
        } else if (have_due && L->defer_ns > 0 && !L->q_len && !L->n_connecting &&
                   until - L->coalesce_ns - now_rel(L) <= L->defer_ns) {
            /* (due within defer_ns, the coalescing wait on top; never while a request
             * waits for a connection or one is being opened: a reply or a connect read late
             * would hold it up) */
            r = wait_events(L, L->ep_wake, evs, 256, until - spin); /* replies wait */
        } else r = wait_events(L, L->ep, evs, 256, until - spin);
        pthread_mutex_lock(&L->mu);
        if (r > 0) handle(L, evs, r);
    }
    L->running = 0;
    pthread_cond_broadcast(&L->ev_cv);
    pthread_mutex_unlock(&L->mu);
    prctl(PR_SET_TIMERSLACK, old_slack > 0 ? old_slack : 0, 0, 0, 0);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(L->finished);
}

static void wake(Loop *L) {
    uint64_t one = 1;
    if (write(L->wake_fd, &one, sizeof one) < 0) { /* already signalled */ }
}

/* stop(): dispatch nothing more and end the run now (Ctrl-C); open requests are abandoned. */
static PyObject *Loop_stop(Loop *L, PyObject *unused) {
    L->stopping = 1;
    wake(L);
    Py_RETURN_NONE;
}

/* end_schedule(): dispatch nothing more; what was dispatched completes normally. */
static PyObject *Loop_end_schedule(Loop *L, PyObject *unused) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&L->mu);
    L->ended = 1;
    check_finished(L);
    pthread_mutex_unlock(&L->mu);
    Py_END_ALLOW_THREADS
    wake(L);
    Py_RETURN_NONE;
}

/* take() -> (records bytes, dispatch offsets bytes (ids from the previous take's end),
 *            queued ids bytes, [(scope, kind, reason, count)], open, queued now,
 *            ids of requests taken as ok and found out of step since: protocol) */
static PyObject *Loop_take(Loop *L, PyObject *unused) {
    Records recs;
    I64s queued, fixes;
    Evs evs;
    Bytes blob;
    Reason reasons[MAX_REASONS];
    int nr;
    int64_t d0, d1;
    int n_open, q_len;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&L->mu);
    recs = L->recs;
    memset(&L->recs, 0, sizeof L->recs);
    queued = L->queued;
    memset(&L->queued, 0, sizeof L->queued);
    fixes = L->fixes;
    memset(&L->fixes, 0, sizeof L->fixes);
    evs = L->evs;
    memset(&L->evs, 0, sizeof L->evs);
    blob = L->blob;
    memset(&L->blob, 0, sizeof L->blob);
    L->woke = 0;
    pthread_cond_broadcast(&L->ev_cv); /* a loop waiting on a full backlog reads again */
    nr = L->n_reasons;
    memcpy(reasons, L->reasons, (size_t)nr * sizeof(Reason));
    L->n_reasons = 0;
    d0 = L->disp_taken;
    d1 = L->disp_taken = L->next_i;
    n_open = L->n_open;
    q_len = (int)L->q_len;
    pthread_mutex_unlock(&L->mu);
    Py_END_ALLOW_THREADS
    PyObject *rb = PyBytes_FromStringAndSize((const char *)recs.v, (Py_ssize_t)(recs.n * sizeof(Record)));
    free(recs.v);
    PyObject *qb = PyBytes_FromStringAndSize((const char *)queued.v, (Py_ssize_t)(queued.n * 8));
    free(queued.v);
    PyObject *db = PyBytes_FromStringAndSize((const char *)(L->disp + d0), (Py_ssize_t)((d1 - d0) * 8));
    PyObject *fb = PyBytes_FromStringAndSize((const char *)fixes.v, (Py_ssize_t)(fixes.n * 8));
    free(fixes.v);
    PyObject *eb = PyBytes_FromStringAndSize((const char *)evs.v, (Py_ssize_t)(evs.n * sizeof(Ev)));
    free(evs.v);
    PyObject *bb = PyBytes_FromStringAndSize(blob.v, (Py_ssize_t)blob.n);
    free(blob.v);
    PyObject *rl = PyList_New(nr);
    for (int i = 0; rl && i < nr; i++)
        PyList_SET_ITEM(rl, i, Py_BuildValue("(iisL)", reasons[i].scope, reasons[i].kind,
                                             reasons[i].reason, (long long)reasons[i].count));
    PyObject *res = NULL;
    if (rb && qb && db && rl && fb && eb && bb)
        res = Py_BuildValue("(OOOOiiOOO)", rb, db, qb, rl, n_open, q_len, fb, eb, bb);
    Py_XDECREF(rb); Py_XDECREF(qb); Py_XDECREF(db); Py_XDECREF(rl); Py_XDECREF(fb);
    Py_XDECREF(eb); Py_XDECREF(bb);
    return res;
}

/* wait(timeout_s) -> True when events waiting for Python passed EV_SOFT bytes (else the
 * run ended or timeout_s passed: the recorder's pace, it takes at least every progress_s). */
static PyObject *Loop_wait(Loop *L, PyObject *args) {
    double timeout_s;
    int backlog;
    if (!PyArg_ParseTuple(args, "d", &timeout_s)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t abs_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec + (int64_t)(timeout_s * 1e9);
    ts.tv_sec = abs_ns / 1000000000LL;
    ts.tv_nsec = abs_ns % 1000000000LL;
    pthread_mutex_lock(&L->mu);
    while (L->running && ev_bytes(L) < EV_SOFT)
        if (pthread_cond_timedwait(&L->ev_cv, &L->mu, &ts) == ETIMEDOUT) break;
    backlog = ev_bytes(L) >= EV_SOFT;
    pthread_mutex_unlock(&L->mu);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(backlog);
}

/* cut(rids int64 bytes): requests whose stream Python found failed; the loop drops their
 * connections at its next turn (do_cuts). */
static PyObject *Loop_cut(Loop *L, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    size_t n = (size_t)b.len / 8;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&L->mu);
    if (grow((void **)&L->cuts.v, &L->cuts.cap, L->cuts.n + n, sizeof(int64_t)) == 0) {
        memcpy(L->cuts.v + L->cuts.n, b.buf, n * 8);
        L->cuts.n += n;
    }
    pthread_mutex_unlock(&L->mu);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    wake(L);
    Py_RETURN_NONE;
}

/* state() -> dict of counters and the done/retried flags (after run() returned) */
static PyObject *Loop_state(Loop *L, PyObject *unused) {
    size_t nn = (size_t)L->n;
    return Py_BuildValue(
        "{sLsLsLsLsLsLsLsisisy#sy#sisisisisLsLsy#sy#sLsLsLsL}", "next_i", (long long)L->next_i, "n_done",
        (long long)L->n_done, "n_sent", (long long)L->n_sent, "opened", (long long)L->opened,
        "connect_failures", (long long)L->connect_failures, "max_open", (long long)L->max_open,
        "disp_taken", (long long)L->disp_taken, "n_open", L->n_open, "queued_now", (int)L->q_len,
        "done", (const char *)L->done, (Py_ssize_t)nn, "retried", (const char *)L->retried,
        (Py_ssize_t)nn, "precise", L->precise, "ended", (int)L->ended, "stopping",
        (int)L->stopping, "short_slice", L->short_slice, "pauses", (long long)L->pauses,
        "paused_ns", (long long)L->paused_ns, "connect_ns", (const char *)L->conn_ns.v,
        (Py_ssize_t)(L->conn_ns.n * 8), "handshake_ns", (const char *)L->hs_ns.v,
        (Py_ssize_t)(L->hs_ns.n * 8), "spin_ns", (long long)L->spin_max_used, "waits",
        (long long)L->waits, "woken", (long long)L->woken, "practiced", (long long)L->practiced);
}

/* frame(kind, chunks, head, eof, max_header, max_line, max_body, delimiter,
 *       response_length) -> dict: the framing of one response without a socket (sans-I/O,
 * as h11's tests feed bytes). The same code as the loop: a one-connection Loop whose
 * request 0 is in flight gets each chunk as one read, then the close when eof. Returns
 * {"outcome": kind name or None (not complete), "status", "bytes", "reason",
 *  "conn_errors": [reasons charged to the connection], "open": still usable}. */
static PyObject *fl_frame(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"kind", "chunks", "head", "eof", "max_header", "max_line",
                            "max_body", "delimiter", "response_length", "max_event",
                            "sse_max_line", NULL};
    const char *kind;
    PyObject *chunks, *delim_obj = Py_None;
    int head = 0, eof = 0;
    long long max_header = 256 * 1024, max_line = 4096, max_body = 1LL << 30, resp_len = -1;
    long long max_event = 16 << 20, sse_max_line = 1 << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|ppLLLOLLL", names, &kind, &chunks, &head,
                                     &eof, &max_header, &max_line, &max_body, &delim_obj,
                                     &resp_len, &max_event, &sse_max_line))
        return NULL;
    PyObject *seq = PySequence_Fast(chunks, "chunks must be a sequence of bytes");
    if (!seq) return NULL;
    Loop *L = calloc(1, sizeof(Loop));
    PyObject *res = NULL;
    if (!L) { Py_DECREF(seq); return PyErr_NoMemory(); }
    L->ep = L->wake_fd = L->ep_wake = -1;
    L->tcp = !strcmp(kind, "tcp");
    L->sse = !strcmp(kind, "openai");
    L->max_event = max_event;
    L->sse_max_line = sse_max_line;
    L->head_req = head;
    L->max_header = max_header;
    L->max_line = max_line;
    L->max_body = max_body;
    L->resp_len = resp_len;
    L->timeout_ns = INT64_MAX;
    L->n = 1;
    L->cap = 1;
    L->q_cap = 2;
    L->done = calloc(1, 1);
    L->retried = calloc(1, 1);
    L->disp = calloc(1, 8);
    L->q = calloc(2, 8);
    L->conns = calloc(1, sizeof(Conn));
    L->idle = calloc(1, sizeof(int));
    L->free_slots = calloc(1, sizeof(int));
    if (!L->done || !L->retried || !L->disp || !L->q || !L->conns || !L->idle ||
        !L->free_slots) { PyErr_NoMemory(); goto out; }
    if (delim_obj != Py_None) {
        char *d;
        Py_ssize_t dl;
        if (PyBytes_AsStringAndSize(delim_obj, &d, &dl) < 0) goto out;
        if (dl < 1 || dl > 255) {
            PyErr_SetString(PyExc_ValueError, "a delimiter of 1 to 255 bytes");
            goto out;
        }
        L->delim = malloc((size_t)dl);
        memcpy(L->delim, d, (size_t)dl);
        L->delim_len = (size_t)dl;
    }
    if (L->tcp && (L->delim == NULL) == (resp_len < 0)) {
        PyErr_SetString(PyExc_ValueError, "exactly one of a delimiter and a response length");
        goto out;
    }
    Conn *c = &L->conns[0];
    c->fd = -1;
    c->reusable = 1;
    c->state = C_OPEN;
    if (L->tcp && L->delim_len > 1) c->tail = malloc(L->delim_len);
    L->n_open = 1;
    c->rid = 0;
    c->t_arrive = NO_TIME; /* (no socket: no kernel times) */
    expect_resp(L, c);
    Py_ssize_t nc = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < nc && c->state == C_OPEN; i++) {
        char *b;
        Py_ssize_t bl;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(seq, i), &b, &bl) < 0) goto out;
        if (bl) on_bytes(L, c, b, (size_t)bl);
    }
    int open = usable(c);
    if (eof && c->state == C_OPEN) {
        c->eof = 1;
        conn_ended(L, c, 0);
        conn_close(L, c);
        open = 0;
    }
    PyObject *errs = PyList_New(0);
    const char *reason = "";
    for (int i = 0; errs && i < L->n_reasons; i++) {
        Reason *r = &L->reasons[i];
        if (r->scope == SC_CONN) {
            for (int64_t k = 0; k < r->count; k++) {
                PyObject *t = PyUnicode_FromString(r->reason);
                if (!t || PyList_Append(errs, t) < 0) { Py_XDECREF(t); Py_CLEAR(errs); break; }
                Py_DECREF(t);
            }
        } else if (r->scope == SC_REQUEST) reason = r->reason;
    }
    if (!errs) goto out;
    if (L->sse) { /* the raw pieces: fast_sse.py words the outcome, as the engine does */
        res = Py_BuildValue("{sy#sy#sy#sNsOsL}", "recs",
                            L->recs.v ? (const char *)L->recs.v : "",
                            (Py_ssize_t)(L->recs.n * sizeof(Record)), "events",
                            L->evs.v ? (const char *)L->evs.v : "",
                            (Py_ssize_t)(L->evs.n * sizeof(Ev)), "blob",
                            L->blob.v ? L->blob.v : "", (Py_ssize_t)L->blob.n, "conn_errors",
                            errs, "open", open ? Py_True : Py_False, "bytes",
                            (long long)c->nbytes);
    } else if (L->recs.n) {
        Record *r = &L->recs.v[0];
        res = Py_BuildValue("{sssisLsssNsO}", "outcome", KIND_NAMES[r->outcome], "status",
                            (int)r->status, "bytes", (long long)r->nbytes, "reason", reason,
                            "conn_errors", errs, "open", open ? Py_True : Py_False);
    } else {
        res = Py_BuildValue("{sOsisLsssNsO}", "outcome", Py_None, "status", 0, "bytes",
                            (long long)c->nbytes, "reason", "", "conn_errors", errs, "open",
                            open ? Py_True : Py_False);
    }
out:
    Py_DECREF(seq);
    if (L->conns) {
        Conn *c0 = &L->conns[0];
        free(c0->buf); free(c0->stamped); free(c0->tail);
        free(c0->line.v); free(c0->ev.v); free(c0->ctype.v); free(c0->ebody.v);
        free(c0->seg_why.v); free(c0->fail_why.v);
    }
    free(L->done); free(L->retried); free(L->disp); free(L->q); free(L->conns); free(L->idle);
    free(L->free_slots); free(L->delim); free(L->recs.v); free(L->queued.v); free(L->fixes.v);
    free(L->evs.v); free(L->blob.v);
    free(L);
    return res;
}

static PyMethodDef module_methods[] = {
    {"frame", (PyCFunction)(void (*)(void))fl_frame, METH_VARARGS | METH_KEYWORDS,
     "the framing of one response, fed bytes without a socket"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef Loop_methods[] = {
    {"prepare", (PyCFunction)Loop_prepare, METH_VARARGS, "open the initial connections"},
    {"run", (PyCFunction)Loop_run, METH_VARARGS, "run the schedule (releases the GIL)"},
    {"stop", (PyCFunction)Loop_stop, METH_NOARGS, "end the run now"},
    {"end_schedule", (PyCFunction)Loop_end_schedule, METH_NOARGS, "dispatch nothing more"},
    {"take", (PyCFunction)Loop_take, METH_NOARGS, "records completed since the last take"},
    {"cut", (PyCFunction)Loop_cut, METH_VARARGS, "drop these requests' connections"},
    {"wait", (PyCFunction)Loop_wait, METH_VARARGS, "until events pile up, or a time-out"},
    {"state", (PyCFunction)Loop_state, METH_NOARGS, "counters and flags"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LoopType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tailgate.bench.fastloop.Loop",
    .tp_basicsize = sizeof(Loop),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One open-loop load loop in C (see fastpath.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Loop_init,
    .tp_dealloc = (destructor)Loop_dealloc,
    .tp_methods = Loop_methods,
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "fastloop",
                                    "The compiled hot path of tailgate bench.", -1,
                                    module_methods};

PyMODINIT_FUNC PyInit_fastloop(void) {
#ifdef __GLIBC__
    /* A recorder that fell behind takes a large batch, and its arrays are freed after: a
     * fixed threshold keeps every block of 256 KiB or more in its own mapping, returned when
     * freed. glibc's default raises the threshold to the largest block freed so far, so the
     * next batches came from the heap and a stall raised the RSS floor for the rest of the
     * run (a 10-minute soak's floor went 666 -> 724 MiB). The setting is the process's, so
     * it is made once, when the engine is first imported, not per Loop. */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
#endif
    if (PyType_Ready(&LoopType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&LoopType);
    if (PyModule_AddObject(m, "Loop", (PyObject *)&LoopType) < 0) {
        Py_DECREF(&LoopType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "RECORD_SIZE", (long)sizeof(Record));
    PyModule_AddIntConstant(m, "MAX_CONNECTING", MAX_CONNECTING);
    /* checked against the Python side at import (fastpath.py) */
    PyModule_AddStringConstant(m, "OUT_OF_STEP", OUT_OF_STEP);
    PyObject *kinds = PyTuple_New(sizeof KIND_NAMES / sizeof *KIND_NAMES);
    for (size_t i = 0; kinds && i < sizeof KIND_NAMES / sizeof *KIND_NAMES; i++)
        PyTuple_SET_ITEM(kinds, (Py_ssize_t)i, PyUnicode_FromString(KIND_NAMES[i]));
    if (!kinds || PyModule_AddObject(m, "KINDS", kinds) < 0) {
        Py_XDECREF(kinds);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "K_CLOSED", K_CLOSED);
    PyModule_AddIntConstant(m, "MAX_SUSPECTS", MAX_SUSPECTS);
    PyModule_AddIntConstant(m, "EVENT_SIZE", (long)sizeof(Ev));
    /* the OpenSSL this process runs (fastpath compares it with ssl.OPENSSL_VERSION_NUMBER) */
    PyModule_AddObject(m, "OPENSSL_VERSION_NUMBER",
                       PyLong_FromUnsignedLong(OpenSSL_version_num()));
    return m;
}
