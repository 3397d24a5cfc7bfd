/* A compiled fake OpenAI completions server for benchmarks/bench_llm_scale.py: many
 * concurrent streams, exact inter-token times, and the time it wrote each chunk.
 *
 * Usage: sse_fake_server PORT_FILE OUT_FILE N_TOKENS GAP_NS [T0_FILE]
 * It listens on 127.0.0.1 (an ephemeral port, written to PORT_FILE). Each request
 * (HTTP/1.1, Content-Length body, keep-alive) is answered at once with a chunked
 * text/event-stream head, then N_TOKENS content chunks, chunk i due GAP_NS * i after the
 * request was read (so the true TTFT is about 0 and the true ITL GAP_NS), then a finish
 * chunk and data: [DONE]. One epoll thread; it sleeps until 30 us before the next due
 * chunk and polls for the rest, so each write leaves on time. After each write() it reads
 * CLOCK_MONOTONIC (the clock tailgate bench times with): that is the chunk's write time.
 * On SIGTERM it writes OUT_FILE: one line per stream, "KEY t0 t1 ... tN-1" (ns), KEY the
 * prompt's first word (tailgate's workloads start each prompt with the request number).
 * With T0_FILE it also writes there, one line per stream in the same order, the time it
 * had read the whole request (ns): t0 - that time is the true TTFT, as the server sees it.
 * With SSE_TLS_CERT and SSE_TLS_KEY (PEM files) in the environment it speaks TLS (OpenSSL
 * over memory BIOs): a chunk's write time is then when its ciphertext was written.
 * With SSE_DECODE_STEPS=1 it emits tokens as an inference engine's decode loop does: one
 * step every GAP_NS on a clock shared by all streams (from the server's start), each step a
 * token for every running stream at the same instant; a new request's first token comes at
 * the next step (so the true TTFT is up to GAP_NS). The chunks then arrive in bursts, one
 * per stream, every step, instead of spread evenly in time.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#define SPIN_NS 30000
#define MAX_IN (1 << 20)

typedef struct {
    char key[32];
    int64_t t0, *t;
    int n;
} Stream;

typedef struct {
    int fd, streaming, next_tok;
    int64_t t0, due;
    int heap_at; /* index in the heap, -1 when not in it */
    char *in;
    size_t in_len;
    char *out; /* what the socket did not take yet */
    size_t out_len, out_cap;
    Stream *s;
    SSL *ssl; /* TLS: the session; its input and output are memory BIOs */
} Conn;

static SSL_CTX *tls;

static volatile sig_atomic_t stop_now;
static int n_tokens;
static int64_t gap_ns;
static int decode_steps;  /* SSE_DECODE_STEPS=1: every stream's token on one step clock */
static int64_t step_base; /* that clock's time 0 (the server's start) */
static Conn **heap;
static int heap_n, heap_cap;
static Stream **streams;
static size_t n_streams, streams_cap;

static void on_term(int sig) { (void)sig; stop_now = 1; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void swap(int a, int b) {
    Conn *x = heap[a];
    heap[a] = heap[b];
    heap[b] = x;
    heap[a]->heap_at = a;
    heap[b]->heap_at = b;
}

static void heap_push(Conn *c) {
    if (heap_n == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 1024;
        heap = realloc(heap, (size_t)heap_cap * sizeof *heap);
    }
    int i = heap_n++;
    heap[i] = c;
    c->heap_at = i;
    while (i > 0 && heap[(i - 1) / 2]->due > heap[i]->due) {
        swap(i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_remove(int i) {
    heap_n--;
    heap[i]->heap_at = -1;
    if (i == heap_n) return;
    heap[i] = heap[heap_n];
    heap[i]->heap_at = i;
    for (;;) { /* down */
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < heap_n && heap[l]->due < heap[m]->due) m = l;
        if (r < heap_n && heap[r]->due < heap[m]->due) m = r;
        if (m == i) break;
        swap(i, m);
        i = m;
    }
    while (i > 0 && heap[(i - 1) / 2]->due > heap[i]->due) { /* up */
        swap(i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void drop(int ep, Conn *c) {
    if (c->heap_at >= 0) heap_remove(c->heap_at);
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->ssl) SSL_free(c->ssl);
    free(c->in);
    free(c->out);
    free(c);
}

/* Write now (what the socket does not take waits for EPOLLOUT); 0 when the peer is gone. */
static int emit_raw(int ep, Conn *c, const char *d, size_t n) {
    if (c->out_len == 0) {
        ssize_t w = write(c->fd, d, n);
        if (w < 0 && errno != EAGAIN) return 0;
        if (w < 0) w = 0;
        d += w;
        n -= (size_t)w;
        if (!n) return 1;
    }
    if (c->out_len + n > c->out_cap) {
        c->out_cap = (c->out_len + n) * 2;
        c->out = realloc(c->out, c->out_cap);
    }
    memcpy(c->out + c->out_len, d, n);
    c->out_len += n;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    return 1;
}

/* What the session wrote goes out (TLS). */
static int flush_tls(int ep, Conn *c) {
    char buf[16384];
    int n;
    while ((n = BIO_read(SSL_get_wbio(c->ssl), buf, sizeof buf)) > 0)
        if (!emit_raw(ep, c, buf, (size_t)n)) return 0;
    return 1;
}

static int emit(int ep, Conn *c, const char *d, size_t n) {
    if (!c->ssl) return emit_raw(ep, c, d, n);
    if (SSL_write(c->ssl, d, (int)n) != (int)n) return 0;
    return flush_tls(ep, c);
}

static int on_request_bytes(int ep, Conn *c);

/* Bytes read from the socket: plaintext, or ciphertext for the session. */
static int on_read(int ep, Conn *c, const char *d, size_t n) {
    if (c->ssl) {
        char plain[16384];
        BIO_write(SSL_get_rbio(c->ssl), d, (int)n);
        if (!SSL_is_init_finished(c->ssl)) {
            int r = SSL_do_handshake(c->ssl);
            if (!flush_tls(ep, c)) return 0;
            if (r != 1) return SSL_get_error(c->ssl, r) == SSL_ERROR_WANT_READ;
        }
        int got;
        while ((got = SSL_read(c->ssl, plain, sizeof plain)) > 0) {
            size_t take = (size_t)got < MAX_IN - c->in_len ? (size_t)got : MAX_IN - c->in_len;
            memcpy(c->in + c->in_len, plain, take);
            c->in_len += take;
        }
        if (SSL_get_error(c->ssl, got) != SSL_ERROR_WANT_READ) return 0;
        if (!flush_tls(ep, c)) return 0;
        return on_request_bytes(ep, c);
    }
    size_t take = n < MAX_IN - c->in_len ? n : MAX_IN - c->in_len;
    memcpy(c->in + c->in_len, d, take);
    c->in_len += take;
    return on_request_bytes(ep, c);
}

static int piece(char *buf, const char *data, int n) {
    return sprintf(buf, "%x\r\n%.*s\r\n", n, n, data);
}

static const char HEAD[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                           "Transfer-Encoding: chunked\r\n\r\n";

/* A complete request is in c->in: start its stream. */
static int start(int ep, Conn *c, const char *body, size_t blen) {
    Stream *s = calloc(1, sizeof *s);
    s->t = calloc((size_t)n_tokens, sizeof(int64_t));
    const char *p = memmem(body, blen, "\"prompt\":", 9);
    if (p) {
        p += 9;
        while (p < body + blen && (*p == ' ' || *p == '"')) p++;
        int k = 0;
        while (p < body + blen && k < 31 && *p != ' ' && *p != '"') s->key[k++] = *p++;
    }
    if (n_streams == streams_cap) {
        streams_cap = streams_cap ? streams_cap * 2 : 4096;
        streams = realloc(streams, streams_cap * sizeof *streams);
    }
    streams[n_streams++] = s;
    c->s = s;
    c->streaming = 1;
    c->next_tok = 0;
    c->t0 = s->t0 = now_ns();
    if (decode_steps) /* the stream joins the batch at the next decode step */
        c->t0 = step_base + (c->t0 - step_base + gap_ns - 1) / gap_ns * gap_ns;
    if (!emit(ep, c, HEAD, sizeof HEAD - 1)) return 0;
    c->due = c->t0;
    heap_push(c);
    return 1;
}

/* Parse what has been read: a complete request starts a stream. */
static int on_request_bytes(int ep, Conn *c) {
    if (c->streaming) return 1; /* (no pipelining: the next request waits for this one) */
    char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
    if (!end) return c->in_len < MAX_IN;
    size_t hl = (size_t)(end - c->in) + 4, cl = 0;
    for (char *q = c->in; q < end; q++) {
        if ((q == c->in || q[-1] == '\n') && !strncasecmp(q, "content-length:", 15)) {
            cl = strtoul(q + 15, NULL, 10);
            break;
        }
    }
    if (c->in_len < hl + cl) return c->in_len < MAX_IN;
    int ok = start(ep, c, c->in + hl, cl);
    memmove(c->in, c->in + hl + cl, c->in_len - hl - cl);
    c->in_len -= hl + cl;
    return ok;
}

/* The next chunk of c's stream is due. */
static int tick(int ep, Conn *c) {
    char data[256], buf[320];
    int i = c->next_tok;
    if (i < n_tokens) {
        int dn = snprintf(data, sizeof data, "data: {\"id\":\"x\",\"object\":\"text_completion\","
                          "\"choices\":[{\"index\":0,\"text\":\" t%d\",\"finish_reason\":null}]}"
                          "\n\n", i);
        int bn = piece(buf, data, dn);
        if (!emit(ep, c, buf, (size_t)bn)) return 0;
        c->s->t[i] = now_ns();
        c->s->n = i + 1;
        c->next_tok = i + 1;
        if (i + 1 < n_tokens) {
            c->due = c->t0 + gap_ns * (i + 1);
            heap_push(c);
            return 1;
        }
    }
    static const char fin[] = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"text\":\"\","
                              "\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n";
    int bn = piece(buf, fin, (int)sizeof fin - 1);
    memcpy(buf + bn, "0\r\n\r\n", 5);
    if (!emit(ep, c, buf, (size_t)bn + 5)) return 0;
    c->streaming = 0;
    return on_request_bytes(ep, c);
}

static void dump(const char *path, const char *t0_path) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    for (size_t i = 0; i < n_streams; i++) {
        Stream *s = streams[i];
        fprintf(f, "%s", s->key[0] ? s->key : "?");
        for (int k = 0; k < s->n; k++) fprintf(f, " %lld", (long long)s->t[k]);
        fputc('\n', f);
    }
    fclose(f);
    if (!t0_path || !(f = fopen(t0_path, "w"))) return;
    for (size_t i = 0; i < n_streams; i++) fprintf(f, "%lld\n", (long long)streams[i]->t0);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: %s PORT_FILE OUT_FILE N_TOKENS GAP_NS [T0_FILE]\n", argv[0]);
        return 2;
    }
    n_tokens = atoi(argv[3]);
    gap_ns = atoll(argv[4]);
    decode_steps = getenv("SSE_DECODE_STEPS") && !strcmp(getenv("SSE_DECODE_STEPS"), "1");
    step_base = now_ns();
    signal(SIGPIPE, SIG_IGN);
    const char *cert = getenv("SSE_TLS_CERT"), *key = getenv("SSE_TLS_KEY");
    if (cert && key) {
        tls = SSL_CTX_new(TLS_server_method());
        if (!tls || SSL_CTX_use_certificate_chain_file(tls, cert) != 1 ||
            SSL_CTX_use_PrivateKey_file(tls, key, SSL_FILETYPE_PEM) != 1) {
            ERR_print_errors_fp(stderr);
            return 1;
        }
    }
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4096) ||
        getsockname(ls, (struct sockaddr *)&a, &al)) {
        perror("listen");
        return 1;
    }
    FILE *pf = fopen(argv[1], "w");
    fprintf(pf, "%d", ntohs(a.sin_port));
    fclose(pf);
    int ep = epoll_create1(0);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &lev);
    struct epoll_event evs[512];
    char rbuf[65536];
    while (!stop_now) {
        int64_t now = now_ns();
        while (heap_n && heap[0]->due <= now) {
            Conn *c = heap[0];
            heap_remove(0);
            if (!tick(ep, c)) drop(ep, c);
            now = now_ns();
        }
        int timeout_ms = 100, r;
        if (heap_n && heap[0]->due - now <= SPIN_NS) r = epoll_wait(ep, evs, 512, 0);
        else {
            int64_t d = heap_n ? heap[0]->due - now - SPIN_NS : 100000000LL;
            struct timespec ts = {.tv_sec = d / 1000000000LL, .tv_nsec = d % 1000000000LL};
            r = epoll_pwait2(ep, evs, 512, &ts, NULL);
            if (r < 0 && errno == ENOSYS) r = epoll_wait(ep, evs, 512, timeout_ms);
        }
        for (int k = 0; k < r; k++) {
            Conn *c = evs[k].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    Conn *n = calloc(1, sizeof *n);
                    n->fd = fd;
                    n->heap_at = -1;
                    n->in = malloc(MAX_IN);
                    if (tls) {
                        BIO *rb = BIO_new(BIO_s_mem()), *wb = BIO_new(BIO_s_mem());
                        BIO_set_mem_eof_return(rb, -1);
                        n->ssl = SSL_new(tls);
                        SSL_set_bio(n->ssl, rb, wb);
                        SSL_set_accept_state(n->ssl);
                    }
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = n};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
                }
                continue;
            }
            if (evs[k].events & EPOLLOUT && c->out_len) {
                ssize_t w = write(c->fd, c->out, c->out_len);
                if (w > 0) {
                    memmove(c->out, c->out + w, c->out_len - (size_t)w);
                    c->out_len -= (size_t)w;
                }
                if (!c->out_len) {
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                }
            }
            if (evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                ssize_t n = read(c->fd, rbuf, sizeof rbuf);
                if (n == 0 || (n < 0 && errno != EAGAIN)) {
                    drop(ep, c);
                    continue;
                }
                if (n > 0 && !on_read(ep, c, rbuf, (size_t)n)) drop(ep, c);
            }
        }
    }
    dump(argv[2], argc == 6 ? argv[5] : NULL);
    return 0;
}
