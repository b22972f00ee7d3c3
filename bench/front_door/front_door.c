/* A prototype front door in C for one request shape: POST <path> with a raw body of exactly one
 * image's pixels, over HTTP/1.1 keep-alive (issue 26, items 4 and 5: what a request path outside
 * Python would reach). Not the service's server: bench/front_door/serve.py drives it to measure the
 * design, and it has none of the service's limits (timeouts, connection caps, pipelining bounds).
 *
 * Threads: `threads` POSIX threads each run an epoll loop over the shared listening socket
 * (EPOLLEXCLUSIVE: one thread wakes an accept) and the connections they accepted. A request's
 * pixels are copied into the bulk being filled (one of `buffers` of max_rows × row_bytes, which
 * Python reads in place) and its connection waits. The bulk's first row writes the eventfd, and
 * so does its `full_rows`-th, so Python's event loop wakes once for however many rows gather
 * before it runs. Python takes the bulk (fd_take: the next free buffer is filled from then on;
 * fd_release gives it back once its rows are staged), queues it on the batcher, and hands the
 * answers over (fd_answer): each goes to the outbox of the thread that owns its connection, which
 * writes it (one send each), so Python's thread makes no syscall an answer.
 *
 * Built without Python's headers and called through ctypes (whose foreign calls release the GIL):
 *     cc -O2 -shared -fPIC -pthread -o libfrontdoor.so front_door.c
 */
#define _GNU_SOURCE
#include <errno.h>
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
#define MAX_BUFFERS 16

enum { CLOSED = 0, IDLE = 1, IN_FLIGHT = 2 };

typedef struct {
    pthread_mutex_t mu;  /* the fields below: the owning thread's, but for the slot's reuse by an accept */
    uint32_t gen;        /* bumped at each accept and close: an answer for an older one is dropped */
    int state;
    int peer_closed;     /* the client closed while its request was in flight: closed once answered */
    int epfd;            /* the owning thread's epoll */
    int owner;           /* the owning thread's index: its outbox gets the connection's answers */
    size_t len, cap;
    char *buf;
} conn_t;

typedef struct {
    int fd;
    uint32_t gen;
    size_t len;
    char *text; /* the whole response, head and body */
} reply_t;

typedef struct {
    pthread_mutex_t mu;
    reply_t *items;
    int n, cap;
    int efd; /* written when the outbox turns non-empty: in its thread's epoll */
} outbox_t;

typedef struct {
    int lfd, efd, threads, row_bytes, max_rows;
    int full_rows;                /* the eventfd is written at the first row of a bulk and again at this many */
    char path[256];
    size_t path_len;
    volatile int stop;
    pthread_t tids[MAX_THREADS];
    int epfds[MAX_THREADS];
    outbox_t outboxes[MAX_THREADS];
    conn_t *conns[MAX_FD];
    pthread_mutex_t table_mu; /* conns[] slots' creation (a slot lives until fd_close, reused by its fd) */
    pthread_mutex_t bulk_mu;  /* the bulk below */
    int buffers;
    uint8_t *buffer[MAX_BUFFERS]; /* max_rows × row_bytes each: the bulk being filled, or taken by Python */
    int taken[MAX_BUFFERS];       /* Python reads it until fd_release */
    int copying[MAX_BUFFERS];     /* rows being copied in outside the lock */
    int filling;                  /* the bulk's buffer */
    int bulk_n;
    uint64_t *bulk_ids;           /* gen << 32 | fd */
    double *bulk_arrived;         /* CLOCK_MONOTONIC seconds */
    uint64_t requests, refused;
} door_t;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void send_all(int fd, const char *text, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, text, n, MSG_NOSIGNAL);
        if (w <= 0) return; /* a refusal the client cannot take: the connection closes after it */
        text += w;
        n -= (size_t)w;
    }
}

static void refuse(int fd, const char *status, const char *why) {
    char text[512];
    int n = snprintf(text, sizeof text,
                     "HTTP/1.1 %s\r\ncontent-type: text/plain\r\ncontent-length: %zu\r\n\r\n%s", status,
                     strlen(why), why);
    send_all(fd, text, (size_t)n);
}

/* With c->mu held. */
static void close_conn(conn_t *c, int fd) {
    close(fd); /* also leaves its epoll */
    c->state = CLOSED;
    c->gen++;
    c->len = 0;
    c->peer_closed = 0;
}

static const char *find_header(const char *head, size_t n, const char *name, size_t *value_len) {
    size_t name_len = strlen(name);
    const char *p = memchr(head, '\n', n);
    while (p && (size_t)(p - head) + 1 + name_len < n) {
        const char *line = p + 1;
        if (strncasecmp(line, name, name_len) == 0) {
            const char *v = line + name_len;
            while (*v == ' ' || *v == '\t') v++;
            const char *end = memchr(v, '\r', (size_t)(head + n - v));
            if (!end) return NULL;
            *value_len = (size_t)(end - v);
            return v;
        }
        p = memchr(line, '\n', (size_t)(head + n - line));
    }
    return NULL;
}

/* With c->mu held and c IDLE: one request out of c->buf, if whole. Returns 1 if one was taken
 * (the connection is then IN_FLIGHT or was answered here), 0 if more bytes are needed, -1 to close. */
static int parse_one(door_t *d, conn_t *c, int fd) {
    char *head_end = memmem(c->buf, c->len, "\r\n\r\n", 4);
    if (!head_end) return c->len > MAX_HEAD ? -1 : 0;
    size_t head_len = (size_t)(head_end - c->buf) + 4;
    size_t value_len = 0;
    if (c->len >= 12 && memcmp(c->buf, "GET /readyz ", 12) == 0) {
        send_all(fd, "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nready", 43);
        memmove(c->buf, c->buf + head_len, c->len - head_len);
        c->len -= head_len;
        return 1;
    }
    if (c->len < 5 || memcmp(c->buf, "POST ", 5) != 0) {
        refuse(fd, "405 Method Not Allowed", "only POST of raw pixels is served here");
        return -1;
    }
    const char *length = find_header(c->buf, head_len, "content-length:", &value_len);
    if (!length) {
        refuse(fd, "411 Length Required", "a Content-Length is needed");
        return -1;
    }
    while (value_len > 0 && (length[value_len - 1] == ' ' || length[value_len - 1] == '\t')) value_len--;
    size_t body_len = 0;
    for (size_t i = 0; i < value_len; i++) {
        if (length[i] < '0' || length[i] > '9' || i == 9) { /* digits only, and at most 9 of them */
            refuse(fd, "400 Bad Request", "the Content-Length is not a number of bytes");
            return -1;
        }
        body_len = body_len * 10 + (size_t)(length[i] - '0');
    }
    if (value_len == 0) {
        refuse(fd, "400 Bad Request", "the Content-Length is empty");
        return -1;
    }
    if (head_len + body_len > c->cap) {
        refuse(fd, "413 Content Too Large", "the body is larger than one image");
        return -1;
    }
    if (c->len < head_len + body_len) return 0;
    const char *path = c->buf + 5;
    size_t rest = (size_t)(c->len - 5);
    int path_ok = rest > d->path_len && memcmp(path, d->path, d->path_len) == 0 && path[d->path_len] == ' ';
    int answered_here = 1;
    if (!path_ok) {
        refuse(fd, "404 Not Found", "no such route");
    } else if ((int)body_len != d->row_bytes) {
        refuse(fd, "400 Bad Request", "the body is not one image's pixels");
    } else {
        pthread_mutex_lock(&d->bulk_mu);
        int wake = 0;
        if (d->bulk_n < d->max_rows) {
            int i = d->bulk_n++, b = d->filling;
            d->bulk_ids[i] = ((uint64_t)c->gen << 32) | (uint32_t)fd;
            d->bulk_arrived[i] = now_s();
            d->requests++;
            d->copying[b]++; /* fd_take waits for the copy: 150 KB an image is not copied under the lock */
            pthread_mutex_unlock(&d->bulk_mu);
            memcpy(d->buffer[b] + (size_t)i * d->row_bytes, c->buf + head_len, body_len);
            pthread_mutex_lock(&d->bulk_mu);
            d->copying[b]--;
            wake = i == 0 || i + 1 == d->full_rows;
            c->state = IN_FLIGHT;
            answered_here = 0;
        } else {
            d->refused++;
        }
        pthread_mutex_unlock(&d->bulk_mu);
        if (answered_here) refuse(fd, "503 Service Unavailable", "the front door's bulk is full");
        if (wake) {
            uint64_t one = 1;
            ssize_t ignored = write(d->efd, &one, sizeof one);
            (void)ignored;
        }
    }
    size_t used = head_len + body_len;
    memmove(c->buf, c->buf + used, c->len - used);
    c->len -= used;
    return 1;
}

/* With c->mu held: read what is there, then take requests while the connection is IDLE. */
static void serve_conn(door_t *d, conn_t *c, int fd) {
    for (;;) {
        if (c->len == c->cap) { close_conn(c, fd); return; }
        ssize_t r = read(fd, c->buf + c->len, c->cap - c->len);
        if (r > 0) { c->len += (size_t)r; continue; }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r < 0 && errno == EINTR) continue;
        if (c->state == IN_FLIGHT) { /* answered first, then closed by write_reply */
            c->peer_closed = 1;
            epoll_ctl(c->epfd, EPOLL_CTL_DEL, fd, NULL);
        } else {
            close_conn(c, fd);
        }
        return;
    }
    while (c->state == IDLE) {
        int taken = parse_one(d, c, fd);
        if (taken < 0) { close_conn(c, fd); return; }
        if (taken == 0) return;
    }
}

static void accept_all(door_t *d, int epfd, int owner) {
    for (;;) {
        int fd = accept4(d->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        if (fd >= MAX_FD) { close(fd); continue; }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_mutex_lock(&d->table_mu);
        conn_t *c = d->conns[fd];
        if (!c) {
            c = calloc(1, sizeof *c);
            pthread_mutex_init(&c->mu, NULL);
            c->cap = MAX_HEAD + (size_t)d->row_bytes;
            c->buf = malloc(c->cap);
            d->conns[fd] = c;
        }
        pthread_mutex_unlock(&d->table_mu);
        pthread_mutex_lock(&c->mu);
        c->gen++;
        c->state = IDLE;
        c->len = 0;
        c->peer_closed = 0;
        c->epfd = epfd;
        c->owner = owner;
        pthread_mutex_unlock(&c->mu);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fd};
        epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
    }
}

typedef struct { door_t *d; int index; } thread_arg_t;

/* With c->mu held: write an answer to the connection it was for, unless that one is gone. */
static void write_reply(conn_t *c, reply_t *r) {
    if (c->gen != r->gen || c->state != IN_FLIGHT) return;
    ssize_t w = c->peer_closed ? -1 : send(r->fd, r->text, r->len, MSG_NOSIGNAL);
    if (w != (ssize_t)r->len) { /* gone, or a short write this prototype does not finish */
        close_conn(c, r->fd);
        return;
    }
    c->state = IDLE;
}

/* The thread's outbox: every answer handed over since it last looked, written. */
static void drain_outbox(door_t *d, outbox_t *box) {
    uint64_t count;
    ssize_t ignored = read(box->efd, &count, sizeof count);
    (void)ignored;
    pthread_mutex_lock(&box->mu);
    reply_t *items = box->items;
    int n = box->n;
    box->items = NULL;
    box->n = box->cap = 0;
    pthread_mutex_unlock(&box->mu);
    for (int i = 0; i < n; i++) {
        conn_t *c = d->conns[items[i].fd];
        pthread_mutex_lock(&c->mu);
        write_reply(c, &items[i]);
        while (c->state == IDLE && c->len > 0) { /* bytes that came while it was in flight */
            int taken = parse_one(d, c, items[i].fd);
            if (taken < 0) close_conn(c, items[i].fd);
            if (taken <= 0) break;
        }
        pthread_mutex_unlock(&c->mu);
        free(items[i].text);
    }
    free(items);
}

static void *run(void *arg) {
    thread_arg_t *a = arg;
    door_t *d = a->d;
    int index = a->index;
    int epfd = d->epfds[index];
    outbox_t *box = &d->outboxes[index];
    free(a);
    struct epoll_event evs[128];
    while (!d->stop) {
        int n = epoll_wait(epfd, evs, 128, 200);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == d->lfd) { accept_all(d, epfd, index); continue; }
            if (fd == box->efd) { drain_outbox(d, box); continue; }
            conn_t *c = d->conns[fd];
            pthread_mutex_lock(&c->mu);
            if (c->state != CLOSED) serve_conn(d, c, fd);
            pthread_mutex_unlock(&c->mu);
        }
    }
    return NULL;
}

door_t *fd_open(int lfd, int threads, int row_bytes, int max_rows, int buffers, int efd, const char *path,
                int full_rows) {
    if (threads < 1 || threads > MAX_THREADS || buffers < 2 || buffers > MAX_BUFFERS || strlen(path) >= sizeof(((door_t *)0)->path)) return NULL;
    door_t *d = calloc(1, sizeof *d);
    d->lfd = lfd; d->efd = efd; d->threads = threads; d->row_bytes = row_bytes; d->max_rows = max_rows;
    strcpy(d->path, path);
    d->path_len = strlen(path);
    pthread_mutex_init(&d->table_mu, NULL);
    pthread_mutex_init(&d->bulk_mu, NULL);
    d->buffers = buffers;
    d->full_rows = full_rows;
    for (int b = 0; b < buffers; b++) d->buffer[b] = malloc((size_t)max_rows * row_bytes);
    d->bulk_ids = malloc(sizeof(uint64_t) * max_rows);
    d->bulk_arrived = malloc(sizeof(double) * max_rows);
    for (int t = 0; t < threads; t++) {
        d->epfds[t] = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = lfd};
        epoll_ctl(d->epfds[t], EPOLL_CTL_ADD, lfd, &ev);
        outbox_t *box = &d->outboxes[t];
        pthread_mutex_init(&box->mu, NULL);
        box->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        struct epoll_event wake = {.events = EPOLLIN, .data.fd = box->efd};
        epoll_ctl(d->epfds[t], EPOLL_CTL_ADD, box->efd, &wake);
        thread_arg_t *a = malloc(sizeof *a);
        a->d = d; a->index = t;
        pthread_create(&d->tids[t], NULL, run, a);
    }
    return d;
}

uint8_t *fd_buffer(door_t *d, int b) { return d->buffer[b]; }

/* The bulk, if any: its rows' count (0: none; -1: no free buffer to fill next, Python holds them all),
 * its buffer's index in *b (read in place until fd_release), its requests' ids and arrival times. */
int fd_take(door_t *d, uint64_t *ids, double *arrived, int *b) {
    pthread_mutex_lock(&d->bulk_mu);
    int next = -1;
    for (int j = 0; j < d->buffers && next < 0; j++)
        if (j != d->filling && !d->taken[j]) next = j;
    if (d->bulk_n == 0 || next < 0) {
        int k = d->bulk_n == 0 ? 0 : -1;
        pthread_mutex_unlock(&d->bulk_mu);
        return k;
    }
    while (d->copying[d->filling] > 0) { /* a row still being copied in: wait for it */
        pthread_mutex_unlock(&d->bulk_mu);
        sched_yield();
        pthread_mutex_lock(&d->bulk_mu);
    }
    int k = d->bulk_n;
    memcpy(ids, d->bulk_ids, sizeof(uint64_t) * k);
    memcpy(arrived, d->bulk_arrived, sizeof(double) * k);
    *b = d->filling;
    d->taken[d->filling] = 1;
    d->filling = next;
    d->bulk_n = 0;
    pthread_mutex_unlock(&d->bulk_mu);
    return k;
}

int fd_waiting(door_t *d) {
    pthread_mutex_lock(&d->bulk_mu);
    int n = d->bulk_n;
    pthread_mutex_unlock(&d->bulk_mu);
    return n;
}

void fd_release(door_t *d, int b) {
    pthread_mutex_lock(&d->bulk_mu);
    d->taken[b] = 0;
    pthread_mutex_unlock(&d->bulk_mu);
}

/* Answer k requests: answer i is bodies[offsets[i]:offsets[i+1]], with `status` ("200 OK"), handed to
 * the outbox of the thread that owns its connection (which writes it). */
void fd_answer(door_t *d, int k, const uint64_t *ids, const char *bodies, const int64_t *offsets,
               const char *status, const char *content_type) {
    int woken[MAX_THREADS] = {0};
    for (int i = 0; i < k; i++) {
        int fd = (int)(uint32_t)ids[i];
        conn_t *c = d->conns[fd];
        if (!c) continue;
        size_t body_len = (size_t)(offsets[i + 1] - offsets[i]);
        char head[160];
        int n = snprintf(head, sizeof head, "HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %zu\r\n\r\n",
                         status, content_type, body_len);
        reply_t r = {.fd = fd, .gen = (uint32_t)(ids[i] >> 32), .len = (size_t)n + body_len};
        r.text = malloc(r.len);
        memcpy(r.text, head, (size_t)n);
        memcpy(r.text + n, bodies + offsets[i], body_len);
        int owner = c->owner; /* stale only for a connection since closed: its answer is then dropped */
        outbox_t *box = &d->outboxes[owner];
        pthread_mutex_lock(&box->mu);
        if (box->n == box->cap) {
            box->cap = box->cap ? 2 * box->cap : 64;
            box->items = realloc(box->items, sizeof(reply_t) * box->cap);
        }
        box->items[box->n++] = r;
        pthread_mutex_unlock(&box->mu);
        woken[owner] = 1;
    }
    for (int t = 0; t < d->threads; t++) {
        if (!woken[t]) continue;
        uint64_t one = 1;
        ssize_t ignored = write(d->outboxes[t].efd, &one, sizeof one);
        (void)ignored;
    }
}

void fd_counts(door_t *d, uint64_t *out) {
    pthread_mutex_lock(&d->bulk_mu);
    out[0] = d->requests;
    out[1] = d->refused;
    pthread_mutex_unlock(&d->bulk_mu);
}

void fd_close(door_t *d) {
    d->stop = 1;
    for (int t = 0; t < d->threads; t++) {
        pthread_join(d->tids[t], NULL);
        close(d->epfds[t]);
        close(d->outboxes[t].efd);
        for (int i = 0; i < d->outboxes[t].n; i++) free(d->outboxes[t].items[i].text);
        free(d->outboxes[t].items);
    }
    for (int fd = 0; fd < MAX_FD; fd++) {
        conn_t *c = d->conns[fd];
        if (!c) continue;
        if (c->state != CLOSED) close(fd);
        free(c->buf);
        free(c);
    }
    for (int b = 0; b < d->buffers; b++) free(d->buffer[b]);
    free(d->bulk_ids); free(d->bulk_arrived);
    free(d);
}
