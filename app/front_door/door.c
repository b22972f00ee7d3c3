/* The front door: HTTP/1.1 in C threads for the one request shape that is most of real traffic, one image's
 * uint8 pixels: POST /predict with them as the body, or a model's v2 infer with them as the one UINT8 tensor of
 * the binary tensor extension, after its JSON inference header (app/front_door/__init__.py
 * says why and where); and POST /predict with a JPEG or PNG as the body, at most one image's pixels in bytes, put
 * at the start of its row for Python to decode over it (jpeg_for_gpu says which nvJPEG takes).
 *
 * Threads: `threads` POSIX threads each run an epoll loop over the shared listening socket
 * (EPOLLEXCLUSIVE: one thread wakes an accept) and the connections they accepted. A request's
 * pixels are copied into the bulk being filled (one of `buffers` of max_rows × row_bytes, which
 * Python reads in place; its header goes beside them, for Python to check: a v2 request's model and JSON
 * inference header, a gRPC call's other fields) and its
 * connection waits. The bulk's first row writes the eventfd, and so does its `full_rows`-th, so
 * Python's event loop wakes once for however many rows gather before it runs. Python takes the
 * bulk (fd_take: the next free buffer is filled from then on; fd_release gives it back once its
 * rows are staged), queues each model's rows on that model's batcher, and hands the answers over (fd_answer): each
 * goes to the outbox of the thread that owns its connection, which writes it, so Python's thread
 * makes no syscall an answer.
 *
 * Limits kept here, as app/http/protocol.py keeps them for the service's port: at most
 * `max_conns` connections (more get 503 and are closed; over the open-file limit too); a request
 * must arrive whole within `request_s` of its first byte (408, closed), and an answer the client
 * does not read within `request_s` is given up with its connection; an idle keep-alive connection
 * is closed after `keepalive_s`; a connection buffers at most one head (8 KiB) and one image, and
 * is not read while its request is in flight and that buffer is full; bodies being read, by their
 * Content-Length, and grpc.c's messages share `max_held_bytes` (503 before the body is read); where
 * `tokens` are set, a request without one of them gets 401 before its pixels are copied (before they
 * are sent, where it asks `Expect: 100-continue`). A request whose client then closes its sending side is still
 * answered. A few GETs (the v2 metadata, configuration and health of the models it serves, which a v2
 * client reads from the address it then sends its inferences to) get the answers Python set last.
 * fd_drain stops accepting: from then on each answer says `connection: close` and closes its
 * connection (an answer built before it began does not close its connection). Every other request (route,
 * method, a head that is not RFC 9112's strict syntax, two Content-Lengths, chunked) gets a clear 4xx in the
 * service's error shape, counted by status; a refusal the
 * socket does not take whole (a client that does not read) closes the connection, so that its
 * client sees an answer cut short, not a stream that goes on without some of its answers.
 *
 * The same threads serve gRPC on a second listener, where one is given (grpc.c: HTTP/2 with nghttp2; door.h holds
 * what the two share). Built without Python's headers (app/front_door/library.py) and called through ctypes, whose
 * foreign calls release the GIL.
 */
#include "door.h"

double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void count_refusal(door_t *d, int which, int v2) {
    pthread_mutex_lock(&d->bulk_mu);
    d->refused[which]++;
    if (v2) d->refused_v2[which]++;
    pthread_mutex_unlock(&d->bulk_mu);
}

/* For a refusal's few hundred bytes, which an empty send buffer takes whole. 0 where it did not (the client
 * is not reading, or is gone): the connection is then closed. */
static int send_all(int fd, const char *text, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, text, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return 0;
        text += w;
        n -= (size_t)w;
    }
    return 1;
}

/* A 401's challenge, as the service's port gives it (app/errors.py's UnauthorizedError, RFC 6750): a wrong token's
 * says so; a missing one gets the bare challenge. */
#define NO_TOKEN "www-authenticate: Bearer realm=\"cudagraph-serve\"\r\n"
#define INVALID_TOKEN "www-authenticate: Bearer realm=\"cudagraph-serve\", error=\"invalid_token\"\r\n"

/* A refusal in the service's error shape ({"error": {"code", "message", "expected"}}), counted where `counted`; to a
 * v2 request, in the protocol's ({"error": "…"}, with Triton's 400 for a 422). Returns whether it was written whole. */
static int refusal(door_t *d, int fd, int which, const char *code, const char *message, const char *extra_head,
                   int closing, int v2, int counted) {
    static const char *reasons[REFUSALS] = {
        "Bad Request", "Unauthorized", "Not Found", "Method Not Allowed", "Request Timeout", "Length Required",
        "Content Too Large", "Unsupported Media Type", "Unprocessable Content", "Request Header Fields Too Large",
        "Service Unavailable"};
    static const char expected[] = "one image's uint8 pixels (%d bytes): POST /predict with Content-Type "
                                   "application/octet-stream and the pixels as the body (or image/jpeg or image/png "
                                   "and a photo of at most that many bytes), or POST /v2/models/<model>/infer with "
                                   "them as the one UINT8 input of the binary tensor extension; every other request "
                                   "goes to the service's HTTP port";
    static const char token[] = "an Authorization: Bearer <token> header with one of the inference tokens "
                                "(CGSERVE_AUTH_TOKENS or CGSERVE_AUTH_TOKENS_FILE)";
    char wanted[512], body[1536], text[2048]; /* the longest message and `expected` together are under 1 KiB */
    if (which == R401)
        snprintf(wanted, sizeof wanted, "%s", token);
    else
        snprintf(wanted, sizeof wanted, expected, d->row_bytes);
    int body_len = v2 ? snprintf(body, sizeof body, "{\"error\":\"%s; expected %s\"}", message, wanted)
                      : snprintf(body, sizeof body,
                                 "{\"error\":{\"code\":\"%s\",\"message\":\"%s\",\"expected\":\"%s\"}}", code,
                                 message, wanted);
    int status = v2 && which == R422 ? R400 : which;
    int n = snprintf(text, sizeof text,
                     "HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s%s\r\n%s",
                     refusal_codes[status], reasons[status], body_len, extra_head,
                     closing ? "connection: close\r\n" : "", body);
    if (counted) count_refusal(d, status, v2);
    return send_all(fd, text, (size_t)n);
}

/* A refusal of an inference request (or of what may have been one), counted into cgserve_requests_total. */
static int refuse(door_t *d, int fd, int which, const char *code, const char *message, const char *extra_head,
                  int closing, int v2) {
    return refusal(d, fd, which, code, message, extra_head, closing, v2, 1);
}

/* With c->mu held. The buffer goes too: a flood of connections leaves no memory behind it. */
void close_conn(door_t *d, conn_t *c, int fd) {
    close(fd); /* also leaves its epoll */
    c->events = 0;
    if (c->h2) h2_free(c);
    c->state = CLOSED;
    c->gen++;
    c->len = 0;
    c->eof = c->close_after = c->paused = c->out_closes = 0;
    c->head.len = 0;
    let_go_bytes(d, (int64_t)c->held); /* a body that never came whole */
    c->held = 0;
    free(c->buf);
    c->buf = NULL;
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = 0;
    pthread_mutex_lock(&d->table_mu);
    d->open_conns--;
    pthread_mutex_unlock(&d->table_mu);
}

/* The connection's events in its thread's epoll, changed only where they change (an answer written puts back
 * the EPOLLIN it already has: no call); 0 takes it out (paused, or its client's last byte read). */
void watch(conn_t *c, int fd, uint32_t events) {
    if (c->events == events) return;
    struct epoll_event ev = {.events = events, .data.fd = fd};
    epoll_ctl(c->epfd, !events ? EPOLL_CTL_DEL : c->events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
    c->events = events;
}

/* With c->mu held, after a refusal that ends the connection: its sending side is shut, and what the client
 * still sends is read and dropped until it closes too (or LINGER_S), since closing a socket with unread
 * input resets it, and a reset can reach the client before the refusal it was sent. */
static void linger_conn(door_t *d, conn_t *c, int fd) {
    if (c->eof) { close_conn(d, c, fd); return; }
    shutdown(fd, SHUT_WR);
    c->state = LINGERING;
    c->since = now_s();
    c->len = 0;
    watch(c, fd, EPOLLIN | EPOLLRDHUP);
}

/* With c->mu held and c LINGERING: drop what came; closed at the client's end of input. */
static void discard(door_t *d, conn_t *c, int fd) {
    char sink[16384];
    for (;;) {
        ssize_t r = read(fd, sink, sizeof sink);
        if (r > 0) continue;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        close_conn(d, c, fd);
        return;
    }
}

/* A header's value (trimmed), or NULL: `name` with its colon, matched case-insensitively at a line's start
 * from `from` on. */
static const char *find_header_from(const char *head, size_t n, const char *from, const char *name,
                                    size_t *value_len) {
    size_t name_len = strlen(name);
    const char *p = memchr(from, '\n', (size_t)(head + n - from));
    while (p && (size_t)(p - head) + 1 + name_len < n) {
        const char *line = p + 1;
        if (strncasecmp(line, name, name_len) == 0) {
            const char *v = line + name_len;
            while (*v == ' ' || *v == '\t') v++;
            const char *end = memchr(v, '\r', (size_t)(head + n - v));
            if (!end) return NULL;
            while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
            *value_len = (size_t)(end - v);
            return v;
        }
        p = memchr(line, '\n', (size_t)(head + n - line));
    }
    return NULL;
}

static const char *find_header(const char *head, size_t n, const char *name, size_t *value_len) {
    return find_header_from(head, n, head, name, value_len);
}

/* Whether `value` is `Bearer <token>` with one of the tokens: the scheme in any case, then spaces, as
 * app/access/tokens.py's bearer_token reads it (one or more spaces before the token, white space after it).
 * The time taken depends on the tokens' lengths, not on the candidate's bytes or length, and every token is
 * compared whatever matched: as app/access/tokens.py's TokenSet, which compares digests. */
int token_ok(door_t *d, const char *value, size_t len) {
    if (len < 7 || strncasecmp(value, "bearer ", 7) != 0) return 0;
    value += 7;
    len -= 7;
    while (len && (*value == ' ' || *value == '\t')) value++, len--;
    while (len && (value[len - 1] == ' ' || value[len - 1] == '\t')) len--;
    int ok = 0;
    for (int t = 0; t < d->n_tokens; t++) {
        unsigned char diff = d->token_lens[t] != len;
        for (size_t i = 0; i < d->token_lens[t]; i++) diff |= (unsigned char)((i < len ? value[i] : 0) ^ d->tokens[t][i]);
        ok |= diff == 0;
    }
    return ok;
}

/* RFC 9110's token characters: a method's and a header name's. */
static int tchar(unsigned char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* The request line as RFC 9112 has it: a method, one space, a target of visible characters, one space, and
 * HTTP/1.1 or HTTP/1.0. */
static int request_line_ok(const char *line, size_t len) {
    const char *space = memchr(line, ' ', len);
    if (!space || space == line || len < 9) return 0;
    for (const char *m = line; m < space; m++)
        if (!tchar((unsigned char)*m)) return 0;
    if (memcmp(line + len - 9, " HTTP/1.1", 9) != 0 && memcmp(line + len - 9, " HTTP/1.0", 9) != 0) return 0;
    const char *t = space + 1, *t_end = line + len - 9;
    if (t >= t_end) return 0;
    for (; t < t_end; t++)
        if ((unsigned char)*t <= 0x20 || *t == 0x7f) return 0;
    return 1;
}

/* What is wrong with a whole head's syntax, or NULL: each line a name, its colon at once, and a value without
 * control characters, ended by CRLF; no folded line; one Host (exactly one in HTTP/1.1); at most one Authorization. Checked once, before any header is read: a proxy
 * before the door that reads a header the door did not (`Transfer-Encoding : chunked`, a header behind a bare
 * CR or LF, a folded line) would frame the body otherwise than the door does (request smuggling). */
static const char *head_problem(const char *head, size_t n) {
    const char *line = head, *blank = head + n - 2; /* the head ends in CRLF CRLF: the blank line's */
    int hosts = 0, authorizations = 0, http11 = 0;
    for (int first = 1; line < blank; first = 0) {
        const char *cr = memchr(line, '\r', (size_t)(blank - line) + 1);
        size_t len = (size_t)(cr - line); /* found: the blank line's CR at the latest */
        if (memchr(line, '\n', len)) return "a line of the head ends in a bare LF, not CRLF";
        if (cr[1] != '\n') return "a line of the head holds a bare CR";
        if (first) {
            if (!request_line_ok(line, len))
                return "the request line is not a method, a target and HTTP/1.1 (or 1.0), one space apart";
            http11 = memcmp(line + len - 8, "HTTP/1.1", 8) == 0;
        } else {
            if (*line == ' ' || *line == '\t') return "a header line begins with whitespace (a folded line)";
            const char *q = line, *end = line + len;
            while (q < end && tchar((unsigned char)*q)) q++;
            if (q == line || q == end || *q != ':')
                return "a header line is not a name, its colon (no space before it) and a value";
            for (q++; q < end; q++)
                if (((unsigned char)*q < 0x20 && *q != '\t') || *q == 0x7f) return "a header value holds a control character";
            hosts += len >= 5 && strncasecmp(line, "host:", 5) == 0;
            authorizations += len >= 14 && strncasecmp(line, "authorization:", 14) == 0;
        }
        line = cr + 2;
    }
    if (hosts > 1) return "the request has two Host headers";
    if (http11 && hosts == 0) return "an HTTP/1.1 request has no Host header";
    /* Which one a proxy or the service's port reads is theirs to say: the service's port refuses two as well. */
    if (authorizations > 1) return "the request has two Authorization headers";
    return NULL;
}

static const refusal_t TAKEN = {-1, NULL, NULL, NULL};

/* A header's value as a byte count: at most 9 digits (no sign, no spaces). -1 where it is not one. */
static long byte_count(const char *value, size_t len) {
    if (len == 0 || len > 9) return -1;
    long n = 0;
    for (size_t i = 0; i < len; i++) {
        if (value[i] < '0' || value[i] > '9') return -1;
        n = n * 10 + (value[i] - '0');
    }
    return n;
}

/* The request line's target, after a method of `method_len` letters and its space; its length in *len (0 where
 * the line has no space after it). */
static const char *target(const char *buf, size_t head_len, size_t method_len, size_t *len) {
    const char *start = buf + method_len + 1, *end = memchr(start, ' ', head_len - method_len - 1);
    *len = end ? (size_t)(end - start) : 0;
    return start;
}

static int same(const char *a, size_t a_len, const char *b, size_t b_len) {
    return a_len && a_len == b_len && memcmp(a, b, a_len) == 0;
}

/* A Content-Type's value is `media`, parameters aside. */
static int media_is(const char *value, size_t len, const char *media) {
    size_t n = strlen(media);
    return value && len >= n && strncasecmp(value, media, n) == 0 && (len == n || value[n] == ';' || value[n] == ' ');
}

/* How many bytes at `p` (of `n`) a model's name or version spans, as the repository names them (app/repository's
 * _NAME): a letter or digit, then letters, digits, '_', '.' and '-'. */
static size_t name_length(const char *p, size_t n) {
    size_t i = 0;
    for (; i < n; i++) {
        char ch = p[i];
        int alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        if (!alnum && !(i && (ch == '_' || ch == '.' || ch == '-'))) break;
    }
    return i;
}

/* Whether `path` is a v2 infer, /v2/models/<name>[/versions/<version>]/infer, and then where its model is: the part
 * between "/v2/models/" and "/infer", at *off from `path`, *len bytes. Python looks the model up; a name the
 * repository could not hold (percent-encoded, say) is not one, and is the service's port's. */
static int v2_infer_model(const char *path, size_t path_len, size_t *off, size_t *len) {
    static const char models[] = "/v2/models/", versions[] = "/versions/", infer[] = "/infer";
    size_t start = sizeof models - 1, i;
    if (path_len <= start || memcmp(path, models, start) != 0) return 0;
    i = start + name_length(path + start, path_len - start);
    if (i == start) return 0;
    if (path_len - i > sizeof versions - 1 && memcmp(path + i, versions, sizeof versions - 1) == 0) {
        size_t version = i + sizeof versions - 1, n = name_length(path + version, path_len - version);
        if (!n) return 0;
        i = version + n;
    }
    if (path_len - i != sizeof infer - 1 || memcmp(path + i, infer, sizeof infer - 1) != 0) return 0;
    *off = start;
    *len = i - start;
    return 1;
}

/* A header's value as a refusal may quote it: its media type (up to a ';'), trimmed, at most n − 1 bytes, each byte
 * a JSON string may hold as it is ('?' for any other: a quote, a backslash, a control or non-ASCII byte); "(none)"
 * where there is none, as the service's port says. */
static void shown(char *out, size_t n, const char *value, size_t len) {
    while (len && (*value == ' ' || *value == '\t')) { value++; len--; }
    size_t i = 0;
    for (; i < len && i + 1 < n && value[i] != ';'; i++) {
        unsigned char ch = (unsigned char)value[i];
        out[i] = ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\' ? (char)ch : '?';
    }
    while (i && out[i - 1] == ' ') i--;
    out[i] = 0;
    if (!i) snprintf(out, n, "(none)");
}

/* What the head asks for, checked before its body is needed: the route, the token, and the body's form and
 * length. Taken (`which` < 0): *header_len is the v2 request's JSON header's length (0 for POST /predict) and
 * *model_off, *model_len where its model is in `buf` (v2_infer_model), *image whether its body is an encoded image.
 * Refused: where the message says what the request sent (a byte count, a media type), it is written into `detail`
 * (DETAIL bytes) and the refusal's own message is NULL; else `detail` is "". */
static refusal_t check_head(door_t *d, const char *buf, size_t head_len, size_t body_len, size_t *header_len,
                            size_t *model_off, size_t *model_len, int *image, char *detail) {
    size_t value_len = 0;
    size_t path_len = 0;
    detail[0] = 0;
    const char *path = target(buf, head_len, 4, &path_len); /* POST */
    int v2 = v2_infer_model(path, path_len, model_off, model_len);
    if (!v2 && !same(path, path_len, d->path, d->path_len))
        return (refusal_t){R404, "not_found",
                           "the front door serves POST /predict and POST /v2/models/<model>[/versions/<v>]/infer, "
                           "without a query; every other route is the service's HTTP port's", ""};
    if (v2) *model_off += (size_t)(path - buf);
    if (d->n_tokens) {
        const char *auth = find_header(buf, head_len, "authorization:", &value_len);
        if (!auth || !token_ok(d, auth, value_len))
            return (refusal_t){R401, "unauthorized",
                               auth ? "the bearer token is not one of the inference tokens" : "the request has no bearer token",
                               auth ? INVALID_TOKEN : NO_TOKEN};
    }
    const char *encoding = find_header(buf, head_len, "content-encoding:", &value_len);
    if (encoding && !(value_len == 8 && strncasecmp(encoding, "identity", 8) == 0))
        return (refusal_t){R415, "unsupported_media_type",
                           "a compressed body (Content-Encoding) is not taken here: send it uncompressed, or to the "
                           "service's HTTP port, which inflates gzip and deflate", ""};
    *header_len = 0;
    *image = 0;
    if (v2) { /* the JSON header and the pixels; its Content-Type is the client's (Triton's set none) */
        const char *value = find_header(buf, head_len, "inference-header-content-length:", &value_len);
        long n = value ? byte_count(value, value_len) : -1;
        if (n < 0)
            return (refusal_t){R422, "invalid_input",
                               value ? "the Inference-Header-Content-Length is not a number of bytes (at most 9 digits)"
                                     : "the request has no Inference-Header-Content-Length: a JSON-only v2 request, "
                                       "which the service's HTTP port takes", ""};
        if (n == 0) /* else its row would pass for a POST /predict's */
            return (refusal_t){R422, "invalid_input",
                               "the Inference-Header-Content-Length is 0 (Triton's raw binary request): the "
                               "service's HTTP port takes it", ""};
        if ((size_t)n + *model_len + 1 > MAX_V2_HEADER) /* its model and a newline go before it (add_row) */
            return (refusal_t){R431, "header_too_large",
                               "the inference header and the model's name in the path are over 4 KiB together", ""};
        if (body_len != (size_t)n + (size_t)d->row_bytes)
            return (refusal_t){R422, "invalid_input", "the binary section is not one image's uint8 pixels of the "
                               "images the front door serves (a model of other images is the service's HTTP port's)",
                               ""};
        *header_len = (size_t)n;
        return TAKEN;
    }
    const char *type = find_header(buf, head_len, "content-type:", &value_len);
    *image = media_is(type, value_len, "image/jpeg") || media_is(type, value_len, "image/png");
    if (!*image && !media_is(type, value_len, "application/octet-stream")) {
        char media[48];
        shown(media, sizeof media, type, type ? value_len : 0);
        snprintf(detail, DETAIL, "content type '%s' is not accepted here", media);
        return (refusal_t){R415, "unsupported_media_type", NULL, ""};
    }
    if (*image && body_len > (size_t)d->row_bytes) /* it goes into its row, where its pixels will be */
        return (refusal_t){R413, "body_too_large",
                           "an image upload here is at most one image's pixels in bytes (C×H×W of the default "
                           "model): send larger ones to the service's port", ""};
    if (!*image && (int)body_len != d->row_bytes) {
        snprintf(detail, DETAIL, "the body has %zu bytes, not one uint8 image (%d bytes)", body_len, d->row_bytes);
        return (refusal_t){R422, "invalid_input", NULL, ""};
    }
    return TAKEN;
}

/* app/codecs/bodies.py's MAX_JPEG_SCANS: a progressive JPEG of more scans goes to Pillow's path, which refuses it. */
#define MAX_JPEG_SCANS 100

/* The SOS markers (0xFF 0xDA) in p[0, n), the bytes from a JPEG's frame header on (the segments before it may hold
 * the pair: an EXIF thumbnail, an ICC profile): byte stuffing keeps it out of the entropy-coded data. */
static int jpeg_scans(const uint8_t *p, size_t n) {
    int scans = 0;
    for (const uint8_t *at = p, *end = p + n; at + 1 < end; at++) {
        at = memchr(at, 0xFF, (size_t)(end - at) - 1);
        if (!at) break;
        scans += at[1] == 0xDA;
    }
    return scans;
}

/* Whether nvJPEG takes this upload as the service's port would send it there (app/codecs/uploads.py's
 * gpu_decodable, without Pillow): a JPEG (SOI first) whose frame, baseline or progressive, holds 8-bit grey or
 * YCbCr of at most max_pixels, ending in an EOI (nvJPEG's hardware decoder would fill in the rows of one cut short
 * without a word), and, progressive, of at most MAX_JPEG_SCANS scans (their Huffman phase runs on a CPU). Anything
 * else is Pillow's, which decodes it or says what is wrong with it. The markers before the frame are walked by their
 * lengths: a few of them, a few bytes each. */
static int jpeg_for_gpu(const uint8_t *p, size_t n, long long max_pixels) {
    if (n < 4 || p[0] != 0xFF || p[1] != 0xD8) return 0;
    size_t i = 2, end = n;
    while (end > 2 && !(p[end - 2] == 0xFF && p[end - 1] == 0xD9)) end--; /* the last EOI, as Pillow's rfind */
    if (end <= 2) return 0;
    while (i + 4 <= n) {
        if (p[i] != 0xFF) return 0;
        while (i < n && p[i] == 0xFF) i++; /* fill bytes */
        if (i + 3 > n) return 0;
        uint8_t m = p[i++];
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue; /* no length */
        size_t len = (size_t)p[i] << 8 | p[i + 1];
        if (len < 2) return 0;
        if (m == 0xC0 || m == 0xC1 || m == 0xC2) { /* baseline, extended, progressive Huffman */
            if (i + 8 > n) return 0;
            long long height = p[i + 3] << 8 | p[i + 4], width = p[i + 5] << 8 | p[i + 6];
            int precision = p[i + 2], components = p[i + 7];
            return precision == 8 && (components == 1 || components == 3) && height > 0 && width > 0 &&
                   height * width <= max_pixels && (m != 0xC2 || jpeg_scans(p + i, n - i) <= MAX_JPEG_SCANS);
        }
        if ((m >= 0xC3 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) || m == 0xDA || m == 0xD9)
            return 0; /* lossless, arithmetic or hierarchical frames; a scan or the end before any frame */
        i += len;
    }
    return 0;
}

/* The index of the answer Python set for `key`, or -1; with gets_mu held. */
static int get_index(door_t *d, const char *key, size_t key_len) {
    for (int i = 0; i < d->n_gets; i++)
        if (d->gets[i].path && same(key, key_len, d->gets[i].path, strlen(d->gets[i].path))) return i;
    return -1;
}

/* The answers Python set: a GET's by its path, a gRPC call's by its method and request (grpc.c's key). */
int find_get(door_t *d, const char *key, size_t key_len, const char *authorization, size_t authorization_len,
             char **head, char **body, size_t *body_len) {
    int found = 0;
    pthread_mutex_lock(&d->gets_mu);
    int i = get_index(d, key, key_len);
    if (i >= 0) {
        get_t *g = &d->gets[i];
        found = g->token && d->n_tokens && !(authorization && token_ok(d, authorization, authorization_len)) ? -1 : 1;
        if (found > 0) {
            *head = strdup(g->head);
            *body = malloc(g->body_len + 1);
            memcpy(*body, g->body, g->body_len);
            *body_len = g->body_len;
        }
    }
    pthread_mutex_unlock(&d->gets_mu);
    return found;
}

/* Whether a GET of `path` has an answer Python set (gRPC's keys, which all hold a '?', are not GETs). */
static int has_get(door_t *d, const char *path, size_t path_len) {
    if (memchr(path, '?', path_len)) return 0;
    pthread_mutex_lock(&d->gets_mu);
    int found = get_index(d, path, path_len) >= 0;
    pthread_mutex_unlock(&d->gets_mu);
    return found;
}

/* Whether `path` is one the door takes POSTs on: its POST /predict, or a v2 infer. */
static int post_route(door_t *d, const char *path, size_t path_len) {
    size_t model_off, model_len;
    return same(path, path_len, d->path, d->path_len) || v2_infer_model(path, path_len, &model_off, &model_len);
}

/* A GET Python set an answer for, or 404 (the HTTP port has the rest); a GET has no body. Returns whether the
 * connection goes on: the answer was written whole, and it does not close it. */
static int answer_get(door_t *d, int fd, const char *buf, size_t head_len, int closing, int v2) {
    size_t path_len = 0, value_len = 0, body_len = 0;
    const char *path = target(buf, head_len, 3, &path_len); /* GET */
    const char *auth = find_header(buf, head_len, "authorization:", &value_len);
    char *head = NULL, *body = NULL, *text = NULL;
    /* A query is never one of these paths, and every gRPC key has one: gRPC's answers are not HTTP/1.1's. */
    int n = 0, found = memchr(path, '?', path_len) ? 0 : find_get(d, path, path_len, auth, value_len, &head, &body, &body_len);
    if (found > 0) {
        size_t cap = strlen(head) + body_len + 128;
        text = malloc(cap);
        n = snprintf(text, cap, "HTTP/1.1 %scontent-length: %zu\r\n%s\r\n", head, body_len,
                     closing ? "connection: close\r\n" : "");
        memcpy(text + n, body, body_len);
        n += (int)body_len;
        free(head);
        free(body);
    }
    /* A GET is a lookup of metadata or readiness, not an inference: its refusals are not counted as requests, as the
     * HTTP port counts none of its lookups (a review: each GET of an unknown model added a v2 request's 404). */
    if (found < 0)
        return refusal(d, fd, R401, "unauthorized", auth ? "the bearer token is not one of the inference tokens"
                       : "the request has no bearer token", auth ? INVALID_TOKEN : NO_TOKEN, closing, v2, 0);
    if (!found && post_route(d, path, path_len)) { /* as a wrong method always is here: refused, and the connection closed */
        refuse(d, fd, R405, "method_not_allowed", "the route takes POST", "allow: POST\r\n", 1, v2);
        return 0;
    }
    if (!found)
        return refusal(d, fd, R404, "not_found", "the front door answers GETs of the v2 metadata, configuration and "
                       "readiness of the models it serves (those of the default model's images), and this is none "
                       "of them: another model, version or route is the service's HTTP port's", "", closing, v2, 0);
    int sent = send_all(fd, text, (size_t)n);
    free(text);
    return sent;
}

/* Whether a head's refusal takes the v2 protocol's error shape: its target is /v2 or under it (after GET, or any
 * other method of four letters and a space, as POST is read). */
static int v2_target(const char *buf, size_t len) {
    int get = len >= 4 && memcmp(buf, "GET ", 4) == 0;
    const char *p = buf + 4 + !get; /* after "GET " or "POST " */
    return len > 9 && memcmp(p, "/v2", 3) == 0 && (p[3] == '/' || p[3] == ' ' || p[3] == '?'); /* GET /v2 too */
}

/* With c->mu held, c IDLE and its head not yet parsed: the head, if whole, checked and kept in c->head. Returns 2
 * for a POST's head kept (its body may still be coming), 1 for a GET answered here, 0 if more bytes are needed,
 * -1 to close. */
static int parse_head(door_t *d, conn_t *c, int fd) {
    char *head_end = memmem(c->buf, c->len, "\r\n\r\n", 4);
    size_t head_len = head_end ? (size_t)(head_end - c->buf) + 4 : c->len;
    if (head_len > MAX_HEAD) {
        refuse(d, fd, R431, "header_too_large", "the request line and headers are over 8 KiB", "", 1, 0);
        return -1;
    }
    if (!head_end) { /* a head of bare LF lines never ends in CRLF CRLF: refused now, not at request_s */
        for (const char *lf = c->buf; (lf = memchr(lf, '\n', c->len - (size_t)(lf - c->buf))); lf++)
            if (lf == c->buf || lf[-1] != '\r') {
                refuse(d, fd, R400, "bad_request", "a line of the head ends in a bare LF, not CRLF", "", 1,
                       v2_target(c->buf, c->len));
                return -1;
            }
        return 0;
    }
    int get = memcmp(c->buf, "GET ", 4) == 0;
    int v2 = v2_target(c->buf, head_len); /* refused in the protocol's error shape */
    const char *problem = head_problem(c->buf, head_len);
    if (problem) {
        refuse(d, fd, R400, "bad_request", problem, "", 1, v2);
        return -1;
    }
    size_t value_len = 0;
    const char *line_end = memchr(c->buf, '\r', head_len);
    int http10 = memcmp(line_end - 9, " HTTP/1.0", 9) == 0;
    if (http10) c->close_after = 1;
    const char *connection = find_header(c->buf, head_len, "connection:", &value_len);
    if (connection && value_len == 5 && strncasecmp(connection, "close", 5) == 0) c->close_after = 1;
    size_t length_len = 0, coding_len = 0; /* the framing headers, each found once */
    const char *length = find_header(c->buf, head_len, "content-length:", &length_len);
    int coded = find_header(c->buf, head_len, "transfer-encoding:", &coding_len) != NULL;
    if (get) { /* a GET has no body: a Content-Length of 0 says so too (as the service's port reads it) */
        if (coded || (length && byte_count(length, length_len) != 0)) {
            refuse(d, fd, R400, "bad_request", "a GET with a body is not taken here: send it without one", "", 1, v2);
            return -1;
        }
        int closing = c->close_after || load(&d->draining);
        int sent = answer_get(d, fd, c->buf, head_len, closing, v2);
        memmove(c->buf, c->buf + head_len, c->len - head_len);
        c->len -= head_len;
        c->since = now_s();
        return closing || !sent ? -1 : 1;
    }
    /* Another method: what its route takes, as the service's port says. So too for a POST to a route not served
     * here whose body could not be read (a chunked POST to /v2/repository/index was told to send a Content-Length);
     * one with a Content-Length is read, and refused 404 by check_head, the connection kept. */
    const char *space = memchr(c->buf, ' ', head_len); /* request_line_ok found one */
    size_t path_len = 0;
    const char *path = target(c->buf, head_len, (size_t)(space - c->buf), &path_len);
    int post = memcmp(c->buf, "POST ", 5) == 0, route = post_route(d, path, path_len);
    if (!post || (!route && (coded || !length))) {
        if (route)
            refuse(d, fd, R405, "method_not_allowed", "the route takes POST", "allow: POST\r\n", 1, v2);
        else if (has_get(d, path, path_len))
            refuse(d, fd, R405, "method_not_allowed", "the route takes GET", "allow: GET\r\n", 1, v2);
        else
            refuse(d, fd, R404, "not_found", "the front door serves POST /predict and POST /v2/models/<model>"
                   "[/versions/<v>]/infer without a query, and GETs of the v2 metadata; every other route is the "
                   "service's HTTP port's", "", 1, v2);
        return -1;
    }
    if (coded) {
        refuse(d, fd, R411, "length_required", "a chunked body is not taken here: send a Content-Length", "", 1, v2);
        return -1;
    }
    if (!length) {
        refuse(d, fd, R411, "length_required", "the request has no Content-Length", "", 1, v2);
        return -1;
    }
    size_t second_len = 0; /* two lengths: a proxy before us may read the other one (request smuggling) */
    if (find_header_from(c->buf, head_len, length, "content-length:", &second_len)) {
        refuse(d, fd, R400, "bad_request", "the request has two Content-Length headers", "", 1, v2);
        return -1;
    }
    long length_value = byte_count(length, length_len);
    if (length_value < 0) {
        refuse(d, fd, R400, "bad_request", "the Content-Length is not a number of bytes (at most 9 digits)", "", 1, v2);
        return -1;
    }
    size_t body_len = (size_t)length_value, header_len = 0, model_off = 0, model_len = 0;
    int image = 0;
    if (head_len + body_len > c->cap) { /* refused before the body is read: it is not drained */
        refuse(d, fd, R413, "body_too_large", "the body is larger than the front door takes (one image's pixels and a "
               "v2 request's inference header): send it to the service's port", "", 1, v2);
        return -1;
    }
    if ((int64_t)body_len > d->max_held_bytes) { /* more than the whole budget: never taken, however idle the door */
        char text[160];
        snprintf(text, sizeof text, "the body is larger than the %lld bytes the front door reads at once "
                 "(CGSERVE_MAX_INFLIGHT_BYTES)", (long long)d->max_held_bytes);
        refuse(d, fd, R413, "body_too_large", text, "", 1, v2);
        return -1;
    }
    if (!hold_bytes(d, (int64_t)body_len)) { /* refused before the body is read, as the service's ports refuse it */
        char text[160];
        snprintf(text, sizeof text, "request bodies of %lld bytes are being read already; this one was refused: retry "
                 "(CGSERVE_MAX_INFLIGHT_BYTES)", (long long)d->max_held_bytes);
        refuse(d, fd, R503, "overloaded", text, "retry-after: 1\r\n", 1, v2);
        return -1;
    }
    c->held = body_len;
    char detail[DETAIL];
    refusal_t refusal = check_head(d, c->buf, head_len, body_len, &header_len, &model_off, &model_len, &image, detail);
    if (c->len < head_len + body_len) {
        const char *expect = find_header(c->buf, head_len, "expect:", &value_len);
        if (expect && !http10 && value_len == 12 && strncasecmp(expect, "100-continue", 12) == 0) {
            if (refusal.which >= 0) { /* refused before its body is sent, as Expect asks */
                refuse(d, fd, refusal.which, refusal.code, detail[0] ? detail : refusal.message, refusal.extra_head,
                       1, v2);
                return -1;
            }
            if (!send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25)) return -1;
        }
    }
    c->head = (head_t){.len = head_len, .body_len = body_len, .header_len = header_len, .image = image, .v2 = v2,
                       .model_off = model_off, .model_len = model_len, .refusal = refusal};
    memcpy(c->head.detail, detail, DETAIL);
    return 2;
}

int add_row(door_t *d, uint64_t id, uint8_t kind, const char *prefix, size_t prefix_len, const char *header,
            size_t header_len, const char *body, size_t len) {
    pthread_mutex_lock(&d->bulk_mu);
    if (d->bulk_n >= d->max_rows) {
        pthread_mutex_unlock(&d->bulk_mu);
        return 0;
    }
    int i = d->bulk_n++, b = d->filling;
    d->bulk_ids[i] = id;
    d->bulk_kinds[i] = kind;
    d->bulk_arrived[i] = now_s();
    int32_t start = i ? d->bulk_header_ends[i - 1] : 0; /* a few hundred bytes: under the lock */
    if (prefix_len) memcpy(d->bulk_headers + start, prefix, prefix_len);
    memcpy(d->bulk_headers + start + prefix_len, header, header_len);
    d->bulk_header_ends[i] = start + (int32_t)(prefix_len + header_len);
    d->bulk_lens[i] = (int32_t)len;
    d->bulk_jpegs += kind == KIND_JPEG;
    __atomic_add_fetch(&d->requests, 1, __ATOMIC_RELAXED);
    d->copying[b]++; /* fd_take waits for the copy: 150 KB an image is not copied under the lock */
    pthread_mutex_unlock(&d->bulk_mu);
    memcpy(d->buffer[b] + (size_t)i * d->row_bytes, body, len);
    pthread_mutex_lock(&d->bulk_mu);
    d->copying[b]--;
    int wake = i == 0 || i + 1 == d->full_rows;
    pthread_mutex_unlock(&d->bulk_mu);
    if (wake) {
        uint64_t one = 1;
        ssize_t ignored = write(d->efd, &one, sizeof one);
        (void)ignored;
    }
    return 1;
}

/* With c->mu held and c IDLE: one request out of c->buf, if whole. Returns 1 if one was taken
 * (the connection is then IN_FLIGHT or was answered here), 0 if more bytes are needed, -1 to close. */
static int parse_one(door_t *d, conn_t *c, int fd) {
    if (!c->head.len) {
        int parsed = parse_head(d, c, fd);
        if (parsed != 2) return parsed;
    }
    head_t h = c->head;
    if (c->len < h.len + h.body_len) return 0;
    /* The whole request is here: whatever the answer, the connection can take the next one after it. */
    c->head.len = 0;
    let_go_bytes(d, (int64_t)c->held); /* its body is copied into the bulk, or answered here, below */
    c->held = 0;
    int closing = c->close_after || load(&d->draining);
    int sent = 1, answered_here = 1;
    if (h.refusal.which >= 0) {
        const char *message = h.detail[0] ? h.detail : h.refusal.message;
        sent = refuse(d, fd, h.refusal.which, h.refusal.code, message, h.refusal.extra_head, closing, h.v2);
    } else {
        c->gen++; /* this request's own: an answer for an earlier one (answered twice) goes nowhere */
        const char *body = c->buf + h.len + h.header_len;
        size_t len = h.body_len - h.header_len;
        uint8_t kind = h.header_len ? KIND_V2 : KIND_PREDICT;
        if (h.image) kind = jpeg_for_gpu((const uint8_t *)body, len, d->max_pixels) ? KIND_JPEG : KIND_IMAGE;
        /* A v2 infer's header goes with its model as its path names it, and a newline: "<model>\n{...}" */
        char prefix[MAX_V2_HEADER];
        size_t prefix_len = h.header_len ? h.model_len + 1 : 0;
        if (prefix_len) {
            memcpy(prefix, c->buf + h.model_off, h.model_len);
            prefix[h.model_len] = '\n';
        }
        struct direct *launcher = kind == KIND_PREDICT ? __atomic_load_n(&d->direct, __ATOMIC_ACQUIRE) : NULL;
        if (launcher && direct_add(launcher, http_id(c->gen, fd), body, len)) {
            __atomic_add_fetch(&d->requests, 1, __ATOMIC_RELAXED);
            c->state = IN_FLIGHT;
            answered_here = 0;
        } else if (add_row(d, http_id(c->gen, fd), kind, prefix, prefix_len, c->buf + h.len, h.header_len, body,
                           len)) {
            c->state = IN_FLIGHT;
            answered_here = 0;
        } else {
            sent = refuse(d, fd, R503, "queue_full", "the front door holds as many images as it may; retry",
                          "retry-after: 1\r\n", closing, h.v2);
        }
    }
    size_t used = h.len + h.body_len;
    memmove(c->buf, c->buf + used, c->len - used);
    c->len -= used;
    c->since = now_s(); /* the next request's clock, or the idle one's */
    if (answered_here && (closing || !sent)) return -1;
    return 1;
}

/* With c->mu held: take requests while the connection is IDLE and whole ones are buffered; one whose client
 * sent its last byte is closed once nothing is left to answer. */
static void parse_buffered(door_t *d, conn_t *c, int fd) {
    while (c->state == IDLE && c->len > 0) {
        int taken = parse_one(d, c, fd);
        if (taken < 0) { linger_conn(d, c, fd); return; }
        if (taken == 0) break;
    }
    if (c->state == IDLE && c->eof) close_conn(d, c, fd);
}

/* With c->mu held: read what is there, then take requests while the connection is IDLE. */
static void serve_conn(door_t *d, conn_t *c, int fd) {
    for (;;) {
        if (c->len == c->cap) {
            if (c->state == IN_FLIGHT) { /* its answer resumes the reading */
                c->paused = 1;
                watch(c, fd, 0);
            }
            break;
        }
        ssize_t r = read(fd, c->buf + c->len, c->cap - c->len);
        if (r > 0) {
            if (c->len == 0 && c->state == IDLE) c->since = now_s();
            size_t asked = c->cap - c->len;
            c->len += (size_t)r;
            if ((size_t)r < asked) break; /* the socket is empty: a read more would only say EAGAIN, and epoll
                                           * (level-triggered) wakes this thread again for what comes next */
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { close_conn(d, c, fd); return; } /* reset */
        /* The client's last byte (it may have closed its sending side only): what it sent is still answered. */
        c->eof = 1;
        watch(c, fd, 0);
        break;
    }
    parse_buffered(d, c, fd);
}

/* One connection over the open-file limit: the spare descriptor makes room to accept it, refuse it and close
 * it, rather than leave it queued while the listener wakes every thread for it again and again. */
static void refuse_over_limit(door_t *d, int lfd) {
    pthread_mutex_lock(&d->table_mu);
    if (d->spare_fd < 0) d->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* lost to another open: again */
    if (d->spare_fd >= 0) {
        close(d->spare_fd);
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0 && lfd == d->lfd) { /* HTTP/1.1's; a gRPC client sees its connection closed */
            refuse(d, fd, R503, "too_many_connections", "the server holds as many connections as it may",
                   "retry-after: 1\r\n", 1, 0);
        }
        if (fd >= 0) close(fd);
        d->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    pthread_mutex_unlock(&d->table_mu);
}

/* Connections on listener `lfd` (HTTP/1.1's, or gRPC's: h2), each owned by this thread from now on. */
static void accept_all(door_t *d, int epfd, int owner, int lfd, int h2) {
    for (;;) {
        /* One thread accepts at a time: the descriptor refuse_over_limit frees for its refusal must not go to
         * another thread's accept, which would leave no spare to free the next time. */
        pthread_mutex_lock(&d->accept_mu);
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) refuse_over_limit(d, lfd);
        pthread_mutex_unlock(&d->accept_mu);
        if (fd < 0) return;
        pthread_mutex_lock(&d->table_mu);
        int full = fd >= MAX_FD || d->open_conns >= d->max_conns;
        if (full) {
            pthread_mutex_unlock(&d->table_mu);
            if (!h2)
                refuse(d, fd, R503, "too_many_connections", "the front door holds as many connections as it may",
                       "retry-after: 1\r\n", 1, 0);
            close(fd);
            continue;
        }
        d->open_conns++;
        if (fd > load(&d->high_fd)) __atomic_store_n(&d->high_fd, fd, __ATOMIC_RELAXED);
        conn_t *c = d->conns[fd];
        if (!c) {
            c = calloc(1, sizeof *c);
            pthread_mutex_init(&c->mu, NULL);
            c->cap = MAX_HEAD + MAX_V2_HEADER + (size_t)d->row_bytes;
            __atomic_store_n(&d->conns[fd], c, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&d->table_mu);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_mutex_lock(&c->mu);
        c->gen++;
        __atomic_store_n(&c->state, IDLE, __ATOMIC_RELAXED);
        c->len = 0;
        c->epfd = epfd;
        __atomic_store_n(&c->owner, owner, __ATOMIC_RELAXED);
        c->since = now_s();
        /* An HTTP/2 connection's requests are buffered by their calls (grpc.c), not in c->buf. */
        if (h2 ? !h2_open(d, c, fd) : !(c->buf = malloc(c->cap))) {
            close_conn(d, c, fd); /* counted open above: close_conn counts it closed */
            pthread_mutex_unlock(&c->mu);
            continue;
        }
        c->events = EPOLLIN | EPOLLRDHUP;
        pthread_mutex_unlock(&c->mu);
        struct epoll_event ev = {.events = c->events, .data.fd = fd};
        epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
    }
}

typedef struct { door_t *d; int index; } thread_arg_t;

/* With c->mu held: the answer's bytes written, as far as the socket takes them. Done: the connection reads
 * again (or is closed, where it was to be); not done: it waits for EPOLLOUT with the rest in c->out. */
static void flush_out(door_t *d, conn_t *c, int fd) {
    while (c->out_off < c->out_len) {
        ssize_t w = send(fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w > 0) { c->out_off += (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!(c->since > 0)) c->since = now_s(); /* the sweep's clock for a client that does not read */
            watch(c, fd, EPOLLOUT);
            return;
        }
        close_conn(d, c, fd);
        return;
    }
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = 0;
    /* Only an answer that said `connection: close` closes it (whatever it sent after): one built before a drain
     * began did not say so, and its client may send again; that next answer says it. */
    if (c->out_closes) { linger_conn(d, c, fd); return; }
    c->state = IDLE;
    c->since = now_s();
    if (c->eof) { /* out of epoll again: what it sent before its last byte is answered, then it is closed */
        watch(c, fd, 0);
        parse_buffered(d, c, fd);
        return;
    }
    c->paused = 0;
    watch(c, fd, EPOLLIN | EPOLLRDHUP); /* back in epoll if the pause took it out: bytes left unread wake it */
    parse_buffered(d, c, fd); /* requests read while it was in flight */
}

/* With c->mu held: an answer to the connection it was for, unless that one is gone. */
static void write_reply(door_t *d, conn_t *c, reply_t *r) {
    if (r->stream) { h2_reply(d, c, r); return; }
    if (c->gen != r->gen || c->state != IN_FLIGHT || c->out) { free(r->text); return; }
    c->out = r->text; /* owned by the connection until written */
    c->out_closes = r->closes;
    c->out_len = r->len;
    c->out_off = 0;
    c->since = 0; /* not yet waiting for the socket */
    flush_out(d, c, r->fd);
}

/* The thread's outbox: every answer handed over since it last looked, written. */
static void drain_outbox(door_t *d, outbox_t *box) {
    uint64_t count;
    /* The eventfd is read before the items are taken, never after: fd_answer writes it only for an item it found the
     * outbox empty for, so a write read after the take could be for an item this take missed, and that item would
     * wait for a wake that has been used up. */
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
        write_reply(d, c, &items[i]);
        pthread_mutex_unlock(&c->mu);
    }
    free(items);
}

/* The thread's idle and slow connections closed: a request not whole `request_s` after its first byte gets
 * 408; an answer the client has not taken `request_s` after the socket first had to wait is given up; a
 * connection idle `keepalive_s` is closed quietly. Draining does not close idle ones sooner: closed at once,
 * one could lose a request its client is writing (app/http/protocol.py's DrainingHttpProtocol says the same). */
static void sweep(door_t *d, int index) {
    double now = now_s();
    int high = load(&d->high_fd);
    for (int fd = 0; fd <= high; fd++) {
        conn_t *c = __atomic_load_n(&d->conns[fd], __ATOMIC_ACQUIRE);
        if (!c || load(&c->state) == CLOSED || load(&c->owner) != index) continue; /* a look: checked below */
        pthread_mutex_lock(&c->mu);
        if (c->state != CLOSED && c->owner == index) {
            if (c->h2) {
                h2_sweep(d, c, fd, now);
            } else if (c->out && c->since > 0 && now - c->since > d->request_s) {
                close_conn(d, c, fd); /* it does not read its answers */
            } else if (c->state == IDLE && c->len > 0 && now - c->since > d->request_s) {
                refuse(d, fd, R408, "request_timeout", "the request did not arrive whole in time", "", 1, 0);
                linger_conn(d, c, fd);
            } else if (c->state == LINGERING && now - c->since > LINGER_S) {
                close_conn(d, c, fd);
            } else if (c->state == IDLE && c->len == 0 && now - c->since > d->keepalive_s) {
                close_conn(d, c, fd);
            }
        }
        pthread_mutex_unlock(&c->mu);
    }
}

static void *run(void *arg) {
    thread_arg_t *a = arg;
    door_t *d = a->d;
    int index = a->index;
    int epfd = d->epfds[index];
    outbox_t *box = &d->outboxes[index];
    free(a);
    struct epoll_event evs[128];
    double swept = now_s();
    while (!load(&d->stop)) {
        int n = epoll_wait(epfd, evs, 128, (int)(SWEEP_S * 1000));
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == d->lfd || fd == d->glfd) {
                if (!load(&d->draining)) accept_all(d, epfd, index, fd, fd == d->glfd);
                continue;
            }
            if (fd == box->efd) { drain_outbox(d, box); continue; }
            conn_t *c = d->conns[fd];
            pthread_mutex_lock(&c->mu);
            if (c->state != CLOSED && c->epfd == epfd) {
                if (c->h2) h2_serve(d, c, fd);
                else if (c->state == LINGERING) discard(d, c, fd);
                else if (c->out) flush_out(d, c, fd); /* writable, or gone: the send says which */
                else if (!c->paused && !c->eof) serve_conn(d, c, fd);
            }
            pthread_mutex_unlock(&c->mu);
        }
        if (now_s() - swept >= SWEEP_S) {
            sweep(d, index);
            swept = now_s();
        }
    }
    return NULL;
}

/* `tokens`: the inference tokens, one a line ("" where requests need none). NULL for arguments out of range. */
door_t *fd_open(int lfd, int glfd, int threads, int row_bytes, int max_rows, int buffers, int efd, const char *path,
                int full_rows, int max_conns, double keepalive_s, double request_s, const char *tokens,
                long long max_held_bytes, long long max_pixels) {
    if (threads < 1 || threads > MAX_THREADS || buffers < 2 || buffers > MAX_BUFFERS || row_bytes < 1 ||
        max_rows < 1 || full_rows < 1 || max_conns < 1 || max_held_bytes < 1 || max_pixels < 1 ||
        strlen(path) >= sizeof(((door_t *)0)->path))
        return NULL;
    door_t *d = calloc(1, sizeof *d);
    d->lfd = lfd; d->glfd = glfd; d->efd = efd; d->threads = threads; d->row_bytes = row_bytes; d->max_rows = max_rows;
    d->max_conns = max_conns; d->keepalive_s = keepalive_s; d->request_s = request_s;
    d->max_held_bytes = max_held_bytes;
    d->max_pixels = max_pixels;
    strcpy(d->path, path);
    d->path_len = strlen(path);
    for (const char *t = tokens; *t && d->n_tokens < MAX_TOKENS;) {
        const char *end = strchr(t, '\n');
        size_t len = end ? (size_t)(end - t) : strlen(t);
        if (len) {
            d->tokens[d->n_tokens] = strndup(t, len);
            d->token_lens[d->n_tokens++] = len;
        }
        t += len + (end != NULL);
    }
    pthread_mutex_init(&d->table_mu, NULL);
    pthread_mutex_init(&d->gets_mu, NULL);
    pthread_mutex_init(&d->accept_mu, NULL);
    pthread_mutex_init(&d->bulk_mu, NULL);
    d->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    d->buffers = buffers;
    d->full_rows = full_rows;
    for (int b = 0; b < buffers; b++) d->buffer[b] = malloc((size_t)max_rows * row_bytes);
    d->bulk_ids = malloc(sizeof(uint64_t) * max_rows);
    d->bulk_arrived = malloc(sizeof(double) * max_rows);
    d->bulk_headers = malloc((size_t)max_rows * MAX_V2_HEADER);
    d->bulk_header_ends = malloc(sizeof(int32_t) * max_rows);
    d->bulk_lens = malloc(sizeof(int32_t) * max_rows);
    d->bulk_kinds = malloc((size_t)max_rows);
    for (int t = 0; t < threads; t++) {
        d->epfds[t] = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = lfd};
        epoll_ctl(d->epfds[t], EPOLL_CTL_ADD, lfd, &ev);
        if (glfd >= 0) {
            struct epoll_event grpc = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = glfd};
            epoll_ctl(d->epfds[t], EPOLL_CTL_ADD, glfd, &grpc);
        }
        outbox_t *box = &d->outboxes[t];
        pthread_mutex_init(&box->mu, NULL);
        box->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        struct epoll_event wake = {.events = EPOLLIN, .data.fd = box->efd};
        epoll_ctl(d->epfds[t], EPOLL_CTL_ADD, box->efd, &wake);
        thread_arg_t *a = malloc(sizeof *a);
        a->d = d; a->index = t;
        pthread_create(&d->tids[t], NULL, run, a);
        pthread_setname_np(d->tids[t], "cgserve-door"); /* top -H, /proc/<pid>/task/<tid>/comm */
    }
    return d;
}

uint8_t *fd_buffer(door_t *d, int b) { return d->buffer[b]; }

/* The bulk, if any: its rows' count (0: none; -1: no free buffer to fill next, Python holds them all),
 * its buffer's index in *b (read in place until fd_release), its requests' ids, arrival times, kinds and rows'
 * bytes (`lens`), and their headers (`headers`, max_rows × MAX_V2_HEADER bytes; row i's ends at header_ends[i],
 * the previous one's end its start: a v2 row's "<model>\n" and JSON header, a gRPC row's fields). */
int fd_take(door_t *d, uint64_t *ids, double *arrived, char *headers, int32_t *header_ends, uint8_t *kinds,
            int32_t *lens, int *b) {
    pthread_mutex_lock(&d->bulk_mu);
    int next = -1;
    for (int j = 0; j < d->buffers && next < 0; j++)
        if (j != d->filling && !d->taken[j]) next = j;
    if (d->bulk_n == 0 || next < 0) {
        int k = d->bulk_n == 0 ? 0 : -1;
        pthread_mutex_unlock(&d->bulk_mu);
        return k;
    }
    int k = d->bulk_n, taken = d->filling;
    memcpy(ids, d->bulk_ids, sizeof(uint64_t) * k);
    memcpy(arrived, d->bulk_arrived, sizeof(double) * k);
    memcpy(header_ends, d->bulk_header_ends, sizeof(int32_t) * k);
    memcpy(kinds, d->bulk_kinds, (size_t)k);
    memcpy(lens, d->bulk_lens, sizeof(int32_t) * k);
    memcpy(headers, d->bulk_headers, (size_t)d->bulk_header_ends[k - 1]);
    d->taken[taken] = 1;
    d->filling = next; /* new rows go there from now on, so the copies into this one only end */
    d->bulk_n = d->bulk_jpegs = 0;
    while (d->copying[taken] > 0) { /* a row still being copied in: wait for it */
        pthread_mutex_unlock(&d->bulk_mu);
        sched_yield();
        pthread_mutex_lock(&d->bulk_mu);
    }
    pthread_mutex_unlock(&d->bulk_mu);
    *b = taken;
    return k;
}

static void free_gets(get_t *gets, int n) {
    for (int i = 0; i < n; i++) { free(gets[i].path); free(gets[i].head); free(gets[i].body); }
    free(gets);
}

/* The GET answers, all n of them (at most MAX_GETS), in place of the last set: answer i is paths[i]'s, "HTTP/1.1 "
 * + heads[i] (the status's rest and whole header lines) + its length + bodies[i] (body_lens[i] bytes); tokens[i]:
 * it asks for an inference token. Made aside and swapped in whole, so that a GET while the set changes (a model
 * loaded) finds either the old answer or the new. 0 where n or a length is out of range (nothing changed). */
int fd_set_gets(door_t *d, int n, char *const *paths, char *const *heads, char *const *bodies, const int *body_lens,
                const int *tokens) {
    if (n < 0 || n > MAX_GETS) return 0;
    for (int i = 0; i < n; i++)
        if (body_lens[i] < 0) return 0;
    get_t *fresh = calloc((size_t)n + 1, sizeof *fresh);
    for (int i = 0; i < n; i++) {
        fresh[i] = (get_t){strdup(paths[i]), strdup(heads[i]), malloc((size_t)body_lens[i] + 1), (size_t)body_lens[i],
                           tokens[i]};
        memcpy(fresh[i].body, bodies[i], (size_t)body_lens[i]);
    }
    pthread_mutex_lock(&d->gets_mu);
    get_t *old = d->gets;
    int old_n = d->n_gets;
    d->gets = fresh;
    d->n_gets = n;
    pthread_mutex_unlock(&d->gets_mu);
    free_gets(old, old_n);
    return 1;
}

/* The bulk being filled: its rows, and of those the JPEGs for the GPU decoder in *jpegs (where not NULL). */
int fd_waiting(door_t *d, int *jpegs) {
    pthread_mutex_lock(&d->bulk_mu);
    int n = d->bulk_n;
    if (jpegs) *jpegs = d->bulk_jpegs;
    pthread_mutex_unlock(&d->bulk_mu);
    return n;
}

void fd_release(door_t *d, int b) {
    pthread_mutex_lock(&d->bulk_mu);
    d->taken[b] = 0;
    pthread_mutex_unlock(&d->bulk_mu);
}

/* Answer k requests: answer i is bodies[offsets[i]:offsets[i+1]], with `status` ("200 OK") and the header
 * lines heads[head_offsets[i]:head_offsets[i+1]] (its content-type and any others), handed to the outbox of
 * the thread that owns its connection (which writes it). A gRPC call's (its id says so: door.h's H2_ID): its
 * response message and its trailers' lines, which grpc.c sends; `status` is not. */
void fd_answer(door_t *d, int k, const uint64_t *ids, const char *bodies, const int64_t *offsets,
               const char *status, const char *heads, const int64_t *head_offsets) {
    int woken[MAX_THREADS] = {0};
    for (int i = 0; i < k; i++) {
        target_t t = id_target(ids[i]);
        int h2 = t.stream != 0, fd = t.fd;
        uint32_t gen = t.gen;
        conn_t *c = fd < MAX_FD ? d->conns[fd] : NULL;
        if (!c) continue;
        pthread_mutex_lock(&c->mu);
        int owner = c->owner, current = (h2 ? H2_GEN(c->gen) : c->gen) == gen && (c->h2 != NULL) == h2;
        int closing = c->close_after || load(&d->draining);
        pthread_mutex_unlock(&c->mu);
        if (!current) continue; /* closed since: nobody to answer */
        size_t body_len = (size_t)(offsets[i + 1] - offsets[i]);
        int lines_len = (int)(head_offsets[i + 1] - head_offsets[i]);
        reply_t r = {.fd = fd, .gen = gen};
        if (h2) { /* its message, and its trailers as Python wrote them (grpc.c sends them) */
            r.stream = t.stream;
            r.len = body_len;
            r.text = malloc(body_len + 1);
            memcpy(r.text, bodies + offsets[i], body_len);
            r.trailers_len = (size_t)lines_len;
            r.trailers = malloc((size_t)lines_len + 1);
            memcpy(r.trailers, heads + head_offsets[i], (size_t)lines_len);
        } else {
            char head[1024];
            int n = snprintf(head, sizeof head, "HTTP/1.1 %s\r\n%.*scontent-length: %zu\r\n%s\r\n", status,
                             lines_len, heads + head_offsets[i], body_len, closing ? "connection: close\r\n" : "");
            if (n < 0 || n >= (int)sizeof head) { /* Python's lines are a few short ones: never, but answered */
                n = snprintf(head, sizeof head, "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n"
                             "connection: close\r\n\r\n");
                body_len = 0;
                closing = 1;
            }
            r.closes = closing;
            r.len = (size_t)n + body_len;
            r.text = malloc(r.len);
            memcpy(r.text, head, (size_t)n);
            memcpy(r.text + n, bodies + offsets[i], body_len);
        }
        outbox_t *box = &d->outboxes[owner];
        pthread_mutex_lock(&box->mu);
        if (box->n == box->cap) {
            box->cap = box->cap ? 2 * box->cap : 64;
            box->items = realloc(box->items, sizeof(reply_t) * box->cap);
        }
        /* Its thread is woken where its outbox was empty. Else the call that found it empty has written its
         * eventfd, or will after its loop, and the thread has not yet taken the outbox: drain_outbox reads the
         * eventfd before it takes every item under this lock, so that write wakes it for this item too. */
        if (box->n++ == 0) woken[owner] = 1;
        box->items[box->n - 1] = r;
        pthread_mutex_unlock(&box->mu);
    }
    for (int t = 0; t < d->threads; t++) {
        if (!woken[t]) continue;
        uint64_t one = 1;
        ssize_t ignored = write(d->outboxes[t].efd, &one, sizeof one);
        (void)ignored;
    }
}

/* out[0]: requests taken; out[1 + i]: refusals with refusal_codes[i]; out[1 + REFUSALS]: connections open;
 * out[2 + REFUSALS + i]: gRPC calls refused with status i; out[2 + REFUSALS + GRPC_CODES + i]: those of the
 * refusals with refusal_codes[i] whose target was under /v2. */
void fd_counts(door_t *d, uint64_t *out) {
    pthread_mutex_lock(&d->bulk_mu);
    out[0] = __atomic_load_n(&d->requests, __ATOMIC_RELAXED);
    for (int i = 0; i < REFUSALS; i++) out[1 + i] = d->refused[i];
    for (int i = 0; i < GRPC_CODES; i++) out[2 + REFUSALS + i] = d->grpc_refused[i];
    for (int i = 0; i < REFUSALS; i++) out[2 + REFUSALS + GRPC_CODES + i] = d->refused_v2[i];
    pthread_mutex_unlock(&d->bulk_mu);
    pthread_mutex_lock(&d->table_mu);
    out[1 + REFUSALS] = (uint64_t)d->open_conns;
    pthread_mutex_unlock(&d->table_mu);
}

int fd_refusal_code(int i) { return i >= 0 && i < REFUSALS ? refusal_codes[i] : 0; }

/* Stop accepting; from now on each answer closes its connection (idle ones at their keep-alive timeout). */
void fd_drain(door_t *d) {
    __atomic_store_n(&d->draining, 1, __ATOMIC_RELAXED);
    for (int t = 0; t < d->threads; t++) {
        epoll_ctl(d->epfds[t], EPOLL_CTL_DEL, d->lfd, NULL);
        if (d->glfd >= 0) epoll_ctl(d->epfds[t], EPOLL_CTL_DEL, d->glfd, NULL);
    }
}

/* Python closes the launcher (launch.c) before it frees the door, and frees no door whose launcher outlived its
 * close. */
void fd_close(door_t *d) {
    __atomic_store_n(&d->stop, 1, __ATOMIC_RELAXED);
    for (int t = 0; t < d->threads; t++) {
        pthread_join(d->tids[t], NULL);
        close(d->epfds[t]);
        close(d->outboxes[t].efd);
        for (int i = 0; i < d->outboxes[t].n; i++) {
            free(d->outboxes[t].items[i].text);
            free(d->outboxes[t].items[i].trailers);
        }
        free(d->outboxes[t].items);
    }
    for (int fd = 0; fd < MAX_FD; fd++) {
        conn_t *c = d->conns[fd];
        if (!c) continue;
        if (c->state != CLOSED) close(fd);
        if (c->h2) h2_free(c);
        free(c->buf);
        free(c->out);
        free(c);
    }
    /* A bulk Python still holds (a batch that outlived the drain's timeout) may yet be read by its engine's
     * staging: its buffer is left to the process's exit rather than freed under it. */
    for (int b = 0; b < d->buffers; b++)
        if (!d->taken[b]) free(d->buffer[b]);
    for (int t = 0; t < d->n_tokens; t++) free(d->tokens[t]);
    free_gets(d->gets, d->n_gets);
    if (d->spare_fd >= 0) close(d->spare_fd);
    free(d->bulk_ids); free(d->bulk_arrived); free(d->bulk_headers); free(d->bulk_header_ends); free(d->bulk_kinds);
    free(d->bulk_lens);
    free(d);
}
