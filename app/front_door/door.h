/* What door.c (HTTP/1.1) and grpc.c (HTTP/2, gRPC) share: the door, its connections, and the calls between them. */
#ifndef CGSERVE_DOOR_H
#define CGSERVE_DOOR_H
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 65536
#define MAX_THREADS 64
#define MAX_HEAD 8192
#define MAX_V2_HEADER 4096 /* a row's header: a v2 request's model, a newline and its JSON inference header
                           * (Triton's clients send ~250 bytes), or a gRPC call's fields but its pixels (~100) */
#define MAX_GETS 1024      /* the answers Python sets (fd_set_gets), for every model the door serves together */
#define MAX_BUFFERS 34 /* server.py's door_buffers at app/config.py's largest in_flight (16) and jpeg_launches (8) */
#define MAX_TOKENS 64
#define SWEEP_S 0.25
#define LINGER_S 2.0 /* a refused connection's input is read and dropped this long at most */

enum { CLOSED = 0, IDLE = 1, IN_FLIGHT = 2, LINGERING = 3 };
/* A bulk row's request: what Python reads its header as, decodes its row from, and answers it in. An image upload
 * (POST /predict, Content-Type image/jpeg or image/png) is its encoded bytes at the start of its row: KIND_JPEG where
 * nvJPEG takes it (jpeg_for_gpu), KIND_IMAGE for Pillow. A KIND_V2 row's header is its model as its path names it
 * ("<name>" or "<name>/versions/<version>"), a newline, then its JSON inference header. */
enum { KIND_PREDICT = 0, KIND_V2 = 1, KIND_GRPC = 2, KIND_JPEG = 3, KIND_IMAGE = 4 };
/* gRPC's status codes 0..16, the refusals grpc.c answers by itself counted by code (fd_counts, after HTTP's). */
#define GRPC_CODES 17
/* An answer's id (a bulk row's, fd_answer's): an HTTP/1.1 request's is its connection's generation << 32 | fd; a
 * gRPC call's has the top bit set, then 16 bits of its connection's generation, its stream (31 bits) and its fd. */
#define H2_ID (1ULL << 63)
#define H2_GEN(gen) ((uint32_t)(gen) & 0xffff) /* the part of a connection's generation a gRPC call's id holds */
typedef struct { int fd; uint32_t gen; int32_t stream; } target_t; /* where an answer goes (stream 0: HTTP/1.1) */
static inline uint64_t http_id(uint32_t gen, int fd) { return (uint64_t)gen << 32 | (uint32_t)fd; }
static inline uint64_t grpc_id(uint32_t gen, int32_t stream, int fd) {
    return H2_ID | (uint64_t)H2_GEN(gen) << 47 | (uint64_t)(uint32_t)stream << 16 | (uint64_t)fd;
}
static inline target_t id_target(uint64_t id) {
    if (id & H2_ID) return (target_t){(int)(id & 0xffff), H2_GEN(id >> 47), (int32_t)((id >> 16) & 0x7fffffff)};
    return (target_t){(int)(uint32_t)id, (uint32_t)(id >> 32), 0};
}
/* The statuses the C side answers by itself, counted for Prometheus (fd_counts, in this order). */
enum { R400, R401, R404, R405, R408, R411, R413, R415, R422, R431, R503, REFUSALS };
static const int refusal_codes[REFUSALS] = {400, 401, 404, 405, 408, 411, 413, 415, 422, 431, 503};

typedef struct { int which; const char *code, *message, *extra_head; } refusal_t;

#define DETAIL 160 /* a refusal's message that says what the request sent (a byte count, a media type) */

/* A POST's head, parsed once it is whole: later reads while its body arrives only count bytes. */
typedef struct {
    size_t len;          /* the head's bytes, its blank line included; 0: not yet whole */
    size_t body_len;     /* Content-Length */
    size_t header_len;   /* a v2 request's JSON inference header (0: a POST /predict) */
    int image;           /* a POST /predict whose body is an encoded image (its row's kind is decided once it is in) */
    int v2;              /* refused in the protocol's error shape */
    size_t model_off, model_len; /* a v2 infer's model in its path ("<name>[/versions/<version>]"): its bytes */
    refusal_t refusal;   /* what the head asks that the door refuses (TAKEN: nothing), answered once the body is in */
    char detail[DETAIL]; /* where set, the refusal's message, with what the request sent (check_head) */
} head_t;

typedef struct {
    pthread_mutex_t mu;  /* the fields below: the owning thread's, but for an answer's hand-over */
    uint32_t gen;        /* bumped at each accept, close and request taken: an answer for another is dropped */
    int state;
    int eof;             /* the client sent its last byte (it may still read): out of epoll, closed once idle */
    int close_after;     /* HTTP/1.0, `connection: close`, or draining: closed once answered */
    int paused;          /* out of epoll while in flight with a full buffer: read again once answered */
    int out_closes;      /* the answer being written said `connection: close`: closed once written */
    int epfd;            /* the owning thread's epoll */
    uint32_t events;     /* what that epoll watches on it (0: it is out of it): see watch() */
    int owner;           /* the owning thread's index: its outbox gets the connection's answers */
    double since;        /* the request being read: its first byte; idle: its last answer; an answer's
                          * rest waiting for the socket: when it first had to wait */
    size_t len, cap;
    char *buf;
    head_t head;         /* the request being read: its head, parsed once whole (head.len 0 until then) */
    size_t held;         /* its body's bytes charged to the door's budget (held_bytes) until it is whole */
    char *out;           /* an answer's rest, where the socket took only part of it */
    size_t out_len, out_off;
    struct h2 *h2;       /* an HTTP/2 connection (gRPC): its session and calls (grpc.c); NULL: HTTP/1.1 */
} conn_t;

/* One GET the door answers itself, as Python set it: a v2 client (perf_analyzer, Triton's) reads the model's
 * metadata and configuration from the address it then sends its inferences to. */
typedef struct {
    char *path;
    char *head;  /* the status line's rest ("200 OK") and whole header lines, without the length */
    char *body;
    size_t body_len;
    int token;   /* asks for an inference token, where tokens are set */
} get_t;

typedef struct {
    int fd;
    uint32_t gen;
    int closes; /* it says `connection: close` */
    size_t len;
    char *text; /* the whole response, head and body; a gRPC call's: its response message (none: an error) */
    int32_t stream;    /* a gRPC call's HTTP/2 stream (0: an HTTP/1.1 answer) */
    char *trailers;    /* a gRPC call's trailers as header lines ("grpc-status: 0\r\n") */
    size_t trailers_len;
} reply_t;

typedef struct {
    pthread_mutex_t mu;
    reply_t *items;
    int n, cap;
    int efd; /* written when the outbox turns non-empty: in its thread's epoll */
} outbox_t;

typedef struct {
    int lfd, efd, threads, row_bytes, max_rows, max_conns;
    int glfd;                     /* the gRPC listener (HTTP/2 without TLS), or -1 */
    int full_rows;                /* the eventfd is written at the first row of a bulk and again at this many */
    double keepalive_s, request_s;
    /* Bodies (HTTP/1.1, by Content-Length) and gRPC messages (by what their buffers hold) being received, in bytes
     * (__atomic), and their limit (CGSERVE_MAX_INFLIGHT_BYTES, as the service's ports): past it a request is
     * refused 503 before its body is read, a gRPC call RESOURCE_EXHAUSTED. */
    int64_t held_bytes, max_held_bytes;
    long long max_pixels;         /* an image upload's at most (CGSERVE_MAX_IMAGE_PIXELS): past it, Pillow's 413 */
    char path[256];               /* "/predict" (a v2 infer's path is matched by v2_infer_model, not kept) */
    size_t path_len;
    char *tokens[MAX_TOKENS];
    size_t token_lens[MAX_TOKENS];
    int n_tokens;
    pthread_mutex_t gets_mu;      /* the GET answers: set by Python's thread, read by the door's */
    get_t *gets;                  /* n_gets of them (fd_set_gets), swapped whole */
    int n_gets;
    int stop, draining;           /* __atomic: set by Python's thread, read by the door's */
    int open_conns;               /* under table_mu */
    int high_fd;                  /* the highest fd accepted (__atomic): sweeps look no further */
    int spare_fd;                 /* held open, closed to accept one connection over the open-file limit */
    pthread_t tids[MAX_THREADS];
    int epfds[MAX_THREADS];
    outbox_t outboxes[MAX_THREADS];
    conn_t *conns[MAX_FD];
    pthread_mutex_t table_mu; /* conns[] slots' creation (a slot lives until fd_close, reused by its fd) */
    pthread_mutex_t accept_mu; /* one accept4 at a time: the spare descriptor's dance (refuse_over_limit) */
    pthread_mutex_t bulk_mu;  /* the bulk below, and the counts */
    int buffers;
    uint8_t *buffer[MAX_BUFFERS]; /* max_rows × row_bytes each: the bulk being filled, or taken by Python */
    int taken[MAX_BUFFERS];       /* Python reads it until fd_release */
    int copying[MAX_BUFFERS];     /* rows being copied in outside the lock */
    int filling;                  /* the bulk's buffer */
    int bulk_n;
    int bulk_jpegs;               /* its rows that are JPEGs for the GPU decoder (KIND_JPEG) */
    uint64_t *bulk_ids;           /* where each answer goes: http_id, grpc_id */
    double *bulk_arrived;         /* CLOCK_MONOTONIC seconds: Python's time.monotonic() */
    char *bulk_headers;           /* the rows' headers, one after another (max_rows × MAX_V2_HEADER) */
    int32_t *bulk_header_ends;    /* row i's header is bulk_headers[ends[i - 1]:ends[i]] (empty: POST /predict) */
    int32_t *bulk_lens;           /* row i's bytes: row_bytes of pixels, or an image upload's length */
    uint8_t *bulk_kinds;          /* KIND_PREDICT, KIND_V2, KIND_GRPC, KIND_JPEG or KIND_IMAGE */
    uint64_t requests, refused[REFUSALS], grpc_refused[GRPC_CODES]; /* requests: __atomic */
    uint64_t refused_v2[REFUSALS]; /* those of refused[] whose target was under /v2 (counted as format v2-binary) */
    struct direct *direct;        /* __atomic: the launcher POST /predict's rows go to first (launch.c), or NULL */
} door_t;

/* door.c's, for grpc.c. */
double now_s(void);
static inline int load(const int *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
/* `n` bytes more charged to the door's budget: 1, or 0 (nothing charged) where that would pass its limit. */
static inline int hold_bytes(door_t *d, int64_t n) {
    if (__atomic_add_fetch(&d->held_bytes, n, __ATOMIC_RELAXED) <= d->max_held_bytes) return 1;
    __atomic_sub_fetch(&d->held_bytes, n, __ATOMIC_RELAXED);
    return 0;
}
static inline void let_go_bytes(door_t *d, int64_t n) { __atomic_sub_fetch(&d->held_bytes, n, __ATOMIC_RELAXED); }
void close_conn(door_t *d, conn_t *c, int fd);
void watch(conn_t *c, int fd, uint32_t events);
int token_ok(door_t *d, const char *value, size_t len);
/* One request's body (`len` bytes: row_bytes of pixels, or an image upload's at most) and header (`prefix`, then
 * `header`: at most MAX_V2_HEADER together) into the bulk being filled: 1, or 0 where the bulk is full. */
int add_row(door_t *d, uint64_t id, uint8_t kind, const char *prefix, size_t prefix_len, const char *header,
            size_t header_len, const char *body, size_t len);
/* A copy of the answer Python set for `key`, with its head and body, or 0 (none; -1: it needs a token not given). */
int find_get(door_t *d, const char *key, size_t key_len, const char *authorization, size_t authorization_len,
             char **head, char **body, size_t *body_len);

/* launch.c's, for door.c: a POST /predict's pixels to the launcher, 1; 0 where it cannot take them (the bulk's). */
int direct_add(struct direct *x, uint64_t id, const char *body, size_t len);
void fd_answer(door_t *d, int k, const uint64_t *ids, const char *bodies, const int64_t *offsets,
               const char *status, const char *heads, const int64_t *head_offsets);

/* grpc.c's, for door.c. */
int h2_open(door_t *d, conn_t *c, int fd);          /* the session of a connection just accepted: 0 failed */
void h2_serve(door_t *d, conn_t *c, int fd);        /* its socket is readable or writable */
void h2_reply(door_t *d, conn_t *c, reply_t *r);    /* an answer Python handed over, in the owning thread */
void h2_sweep(door_t *d, conn_t *c, int fd, double now); /* idle, stalled and draining connections closed */
void h2_free(conn_t *c);                            /* from close_conn */
#endif
