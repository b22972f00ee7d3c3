/* gRPC on the front door: HTTP/2 (nghttp2) in the door's own threads, for the call that is most of a gRPC
 * client's traffic: ModelInfer with one image's uint8 pixels as its one raw_input_contents entry (Triton's clients
 * and perf_analyzer send a UINT8 input so), of any model that takes them (Python routes each by its model_name).
 *
 * A connection accepted on the gRPC listener gets an nghttp2 server session, driven by its owning thread as
 * door.c drives an HTTP/1.1 connection: bytes read go into nghttp2_session_mem_recv, whose callbacks gather each
 * call's headers and message; bytes nghttp2_session_mem_send gives go out, and what the socket does not take waits
 * in c->out for EPOLLOUT. nghttp2 does HPACK, flow control, SETTINGS, PING and GOAWAY; its session is only ever
 * touched by the owning thread (Python's answers reach it through the thread's outbox, as HTTP/1.1's do).
 *
 * A ModelInfer message is walked as protobuf without a schema: its one field 7 (raw_input_contents) is the row,
 * copied into the bulk; every other field, as sent (its id's first), is the row's header, which Python checks once
 * per distinct header but for the id (app/front_door/grpc_calls.py), as a v2 request's JSON header is. Python answers each call
 * with its ModelInferResponse message and its trailers ("grpc-status: 0"), or with no message and an error's
 * trailers. Other calls of GRPCInferenceService (a client's ServerLive, ModelMetadata, ModelConfig, ModelReady
 * before its inferences) get the answer Python set for the method and that very request (find_get's key: the
 * path, "?", the request's bytes in hex), a second stale at most; ModelReady of a model the service does not serve
 * is false (Triton's answer), another call about a model the door does not serve is NOT_FOUND, and any other call
 * UNIMPLEMENTED, each naming the service's gRPC port, which serves everything.
 *
 * Limits: at most MAX_STREAMS calls a connection at once (its SETTINGS); a call's message at most one image and
 * a 4 KiB header (ModelInfer) or MAX_SMALL_MESSAGE (the rest), its buffer charged to the door's `max_held_bytes`
 * with the HTTP bodies being read (RESOURCE_EXHAUSTED past it); a call must arrive whole within `request_s` of its
 * headers (else DEADLINE_EXCEEDED, its stream reset) and its answer be taken within `request_s` (else the
 * connection is closed: a client that does not read, or never opens its window); a connection without calls is
 * closed after `keepalive_s`, with a GOAWAY; tokens as HTTP's (`authorization: Bearer …` metadata). A call that no
 * message could make servable (another method, no token) is refused at its headers, a stream (ModelStreamInfer)
 * at its first message. A drain sends GOAWAY: every call up to it is answered, then the connection closes.
 */
#include "door.h"

#include <nghttp2/nghttp2.h>

#define SERVICE "/inference.GRPCInferenceService/"
#define INFER SERVICE "ModelInfer"
#define MAX_STREAMS 128 /* a connection's calls at once: with ResNet-50's 150 KB images, ~20 MB buffered at most */
#define RESETS_BURST 1024 /* calls a client may cancel at once, then RESETS_A_SECOND (nghttp2's rapid-reset guard) */
#define RESETS_A_SECOND 512
#define MAX_SMALL_MESSAGE 4096 /* a call other than ModelInfer: a model's name and version */
#define MAX_HEADER_LIST 16384  /* a call's headers and metadata, as HTTP/2 counts them (SETTINGS_MAX_HEADER_LIST_SIZE) */
#define MAX_PATH 128
#define MAX_AUTH 1024
/* Every call the door does not serve is told this. */
#define NOT_SERVED "the front door answers ModelInfer of its model with one UINT8 image, and its model's metadata, " \
                   "configuration and readiness; send this call to the service's gRPC port"
#define READS_A_TURN 16 /* 64 KiB reads of one connection before the thread's other connections */

/* gRPC's status codes, the ones sent here. */
enum { INVALID_ARGUMENT = 3, DEADLINE_EXCEEDED = 4, NOT_FOUND = 5, RESOURCE_EXHAUSTED = 8, UNIMPLEMENTED = 12,
       UNAUTHENTICATED = 16 };
/* The calls about one model whose answers Python sets for each model (and version) the door serves. */
static const char *const MODEL_CALLS[] = {"ModelMetadata", "ModelConfig", "ModelReady"};
/* Said with UNAUTHENTICATED, after what was wrong. */
#define TOKEN_EXPECTED "; expected `authorization: Bearer <token>` metadata with one of the inference tokens " \
                       "(CGSERVE_AUTH_TOKENS or CGSERVE_AUTH_TOKENS_FILE)"

typedef struct call {
    struct call *prev, *next; /* the connection's calls, freed with it (nghttp2_session_del frees no user data) */
    int32_t stream;
    char path[MAX_PATH];
    size_t path_len;        /* 0: none, or longer than MAX_PATH */
    int infer;              /* the path is ModelInfer's */
    int stream_call;        /* ModelStreamInfer's: refused at its first message (at its headers, a client's first
                               write raced the status: grpcio's aio client saw INTERNAL in 29 of 60 calls,
                               bench/results/2026-12-06-cpu-door-stream-refusal.md) */
    int post, grpc;         /* :method POST; content-type application/grpc… */
    char auth[MAX_AUTH];
    size_t auth_len;        /* 0: none; over MAX_AUTH: too long to be a token (auth holds none of it) */
    int auths;              /* authorization entries: two are refused, whichever is right (as the gRPC port) */
    char *message;          /* its body: the 5-byte gRPC prefix and the request */
    size_t len, cap;
    int too_large, ended;   /* more than a call of its method holds came; the client's last frame came */
    int done;               /* answered here, or its row taken (Python answers it): nothing more is read of it */
    double since;           /* its HEADERS came: it must be whole within request_s */
    double answered;        /* its answer was handed to nghttp2 (0: not yet): it must be sent within request_s */
    char prefix[5];         /* the answer's DATA: this gRPC message prefix, then `out` */
    char *out;              /* the response message (NULL: none, or empty) */
    size_t out_len, out_off; /* out_off: of the prefix and the message together */
    char *trailers;         /* its trailers as header lines, sent after the DATA */
    size_t trailers_len;
} call_t;

struct h2 {
    door_t *d;
    conn_t *c;
    int fd;
    nghttp2_session *s;
    call_t *calls;          /* open streams */
    int open;               /* calls open */
    int goaway;             /* a drain's GOAWAY sent */
    double idle_since;      /* when its last call closed (or it was accepted): idle for keepalive_s, it is closed */
    double stuck_since;     /* when the socket first did not take what was to be sent (0: it does) */
};

/* The call's message freed, and its bytes no longer charged to the door's budget. */
static void drop_message(door_t *d, call_t *call) {
    let_go_bytes(d, (int64_t)call->cap);
    free(call->message);
    call->message = NULL;
    call->len = call->cap = 0;
}

/* An answer's trailers: `lines` ("name: value\r\n"…) as nghttp2's pairs, pointing into `lines`; at most `most`. */
static int parse_lines(char *lines, size_t len, nghttp2_nv *nv, int most) {
    int n = 0;
    char *p = lines, *end = lines + len;
    while (p < end && n < most) {
        char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        char *colon = memchr(p, ':', (size_t)((eol ? eol : end) - p));
        if (!eol || !colon) break;
        char *value = colon + 1;
        while (value < eol && *value == ' ') value++;
        nv[n++] = (nghttp2_nv){(uint8_t *)p, (uint8_t *)value, (size_t)(colon - p), (size_t)(eol - value),
                               NGHTTP2_NV_FLAG_NONE};
        p = eol + 2;
    }
    return n;
}

#define NV(name, value) {(uint8_t *)(name), (uint8_t *)(value), sizeof(name) - 1, sizeof(value) - 1, NGHTTP2_NV_FLAG_NONE}

static ssize_t read_answer(nghttp2_session *s, int32_t stream, uint8_t *buf, size_t length, uint32_t *flags,
                           nghttp2_data_source *source, void *user_data) {
    (void)user_data;
    call_t *call = source->ptr;
    size_t total = sizeof call->prefix + call->out_len, n = 0;
    while (call->out_off < sizeof call->prefix && n < length) buf[n++] = (uint8_t)call->prefix[call->out_off++];
    if (call->out_off < total && n < length) {
        size_t k = total - call->out_off < length - n ? total - call->out_off : length - n;
        memcpy(buf + n, call->out + (call->out_off - sizeof call->prefix), k);
        n += k;
        call->out_off += k;
    }
    if (call->out_off == total) { /* the trailers end the stream */
        *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        nghttp2_nv nv[4];
        int k = parse_lines(call->trailers, call->trailers_len, nv, 4);
        if (nghttp2_submit_trailer(s, stream, nv, (size_t)k) != 0) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    return (ssize_t)n;
}

/* Whether an answer's trailers say OK: it then carries its message, empty too (ServerReadyResponse{ready: false}). */
static int says_ok(const char *lines, size_t len) {
    return len >= 16 && memcmp(lines, "grpc-status: 0\r\n", 16) == 0;
}

/* A call answered: its trailers' lines, and its response message where they say OK (an error's: trailers only).
 * Both buffers are the call's from now on (malloc's; `message` may be NULL where it is empty): not copied again. */
static void respond(struct h2 *h, call_t *call, char *message, size_t len, char *lines, size_t lines_len) {
    call->done = 1;
    call->answered = now_s();
    call->trailers = lines;
    call->trailers_len = lines_len;
    if (!lines) { /* out of memory for them */
        free(message);
        nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, call->stream, NGHTTP2_INTERNAL_ERROR);
        return;
    }
    if (!says_ok(lines, lines_len)) { /* trailers only: one HEADERS that ends the stream */
        free(message);
        nghttp2_nv nv[6] = {NV(":status", "200"), NV("content-type", "application/grpc")};
        int k = 2 + parse_lines(call->trailers, call->trailers_len, nv + 2, 4);
        nghttp2_submit_response(h->s, call->stream, nv, (size_t)k, NULL);
        return;
    }
    uint32_t n = (uint32_t)len;
    call->prefix[0] = 0; /* not compressed */
    call->prefix[1] = (char)(n >> 24); call->prefix[2] = (char)(n >> 16); call->prefix[3] = (char)(n >> 8);
    call->prefix[4] = (char)n;
    call->out = message;
    call->out_len = len;
    call->out_off = 0;
    nghttp2_nv nv[2] = {NV(":status", "200"), NV("content-type", "application/grpc")};
    nghttp2_data_provider body = {.source.ptr = call, .read_callback = read_answer};
    nghttp2_submit_response(h->s, call->stream, nv, 2, &body);
}

/* Whether the call is the service's `method`. */
static int call_is(const call_t *call, const char *method) {
    size_t prefix = sizeof SERVICE - 1, n = strlen(method);
    return call->path_len == prefix + n && memcmp(call->path, SERVICE, prefix) == 0 &&
           memcmp(call->path + prefix, method, n) == 0;
}

/* Whether the call is one of MODEL_CALLS. */
static int model_call(const call_t *call) {
    for (size_t i = 0; i < sizeof MODEL_CALLS / sizeof *MODEL_CALLS; i++)
        if (call_is(call, MODEL_CALLS[i])) return 1;
    return 0;
}

/* A call refused here, counted by its code unless it is one of MODEL_CALLS (a lookup, not an inference: the gRPC port
 * counts none of them); `message` percent-encoded as grpc-message asks (it is ASCII). */
static void refuse_call(struct h2 *h, call_t *call, int code, const char *message) {
    char lines[1024];
    int n = snprintf(lines, sizeof lines, "grpc-status: %d\r\ngrpc-message: ", code);
    for (const char *m = message; *m && n < (int)sizeof lines - 8; m++)
        n += *m == '%' || *m < 0x20 || *m > 0x7e ? snprintf(lines + n, 4, "%%%02X", (unsigned char)*m)
                                                 : (lines[n] = *m, 1);
    n += snprintf(lines + n, sizeof lines - (size_t)n, "\r\n");
    if (!model_call(call)) {
        pthread_mutex_lock(&h->d->bulk_mu);
        h->d->grpc_refused[code]++;
        pthread_mutex_unlock(&h->d->bulk_mu);
    }
    respond(h, call, NULL, 0, strndup(lines, (size_t)n), (size_t)n);
}

static int varint(const uint8_t *p, size_t n, size_t *at, uint64_t *value) {
    *value = 0;
    for (int shift = 0; shift < 64 && *at < n; shift += 7) {
        uint8_t b = p[(*at)++];
        *value |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return 1;
    }
    return 0;
}

/* `n` bytes of a request's fields after the `*len` already in `header`: 0 where that would be over MAX_V2_HEADER. */
static int keep(char *header, size_t *len, const uint8_t *from, size_t n) {
    if (*len + n > MAX_V2_HEADER) return 0;
    memcpy(header + *len, from, n);
    *len += n;
    return 1;
}

#define FIELDS_TOO_LARGE "the request's fields other than raw_input_contents are over 4 KiB"

/* A ModelInferRequest walked as protobuf: its raw_input_contents entries (field 7) counted, the last in *raw; every
 * other field copied as sent into `header` (at most MAX_V2_HEADER), its id (field 3, the last one sent: protobuf's
 * rule) first, so that Python finds the rest, the same from call to call of a client that numbers its calls, without
 * parsing it (grpc_calls.py). NULL, or what is wrong with it. */
static const char *split_request(const uint8_t *p, size_t n, const uint8_t **raw, size_t *raw_len, int *raws,
                                 char *header, size_t *header_len) {
    size_t at = 0, id_start = 0, id_len = 0;
    *raws = 0;
    *header_len = 0;
    while (at < n) {
        size_t start = at;
        uint64_t tag, len = 0;
        if (!varint(p, n, &at, &tag)) return "the request is not a ModelInferRequest (a field's tag is cut short)";
        switch (tag & 7) {
        case 0: if (!varint(p, n, &at, &len)) return "the request is not a ModelInferRequest (a varint is cut short)"; break;
        case 1: at += 8; break;
        case 5: at += 4; break;
        case 2:
            if (!varint(p, n, &at, &len) || len > n - at)
                return "the request is not a ModelInferRequest (a field is longer than the message)";
            if (tag >> 3 == 7) {
                *raw = p + at;
                *raw_len = (size_t)len;
                ++*raws;
            }
            at += (size_t)len;
            break;
        default: return "the request is not a ModelInferRequest (a field of an unknown wire type)";
        }
        if (at > n) return "the request is not a ModelInferRequest (a field is longer than the message)";
        if (tag >> 3 == 7 && (tag & 7) == 2) continue;
        if (tag == (3 << 3 | 2) && p[start] == (3 << 3 | 2)) { /* its usual one-byte tag: put first below */
            /* an earlier id: kept in place, where Python's parse checks it (the last one wins) */
            if (id_len && !keep(header, header_len, p + id_start, id_len)) return FIELDS_TOO_LARGE;
            id_start = start;
            id_len = at - start;
            continue;
        }
        if (!keep(header, header_len, p + start, at - start)) return FIELDS_TOO_LARGE;
    }
    if (id_len) { /* first */
        if (*header_len + id_len > MAX_V2_HEADER) return FIELDS_TOO_LARGE;
        memmove(header + id_len, header, *header_len);
        memcpy(header, p + id_start, id_len);
        *header_len += id_len;
    }
    return NULL;
}

/* A whole ModelInfer call: its row into the bulk, or refused. */
static void take_infer(struct h2 *h, call_t *call, const uint8_t *request, size_t len) {
    door_t *d = h->d;
    const uint8_t *raw = NULL;
    size_t raw_len = 0, header_len = 0;
    int raws = 0;
    char header[MAX_V2_HEADER];
    const char *wrong = split_request(request, len, &raw, &raw_len, &raws, header, &header_len);
    if (wrong) { refuse_call(h, call, INVALID_ARGUMENT, wrong); return; }
    if (raws != 1 || raw_len != (size_t)d->row_bytes) {
        char text[512];
        snprintf(text, sizeof text,
                 "the front door takes one image's uint8 pixels (%d bytes) as the one raw_input_contents entry, not "
                 "%d entries%s; send other requests to the service's gRPC port",
                 d->row_bytes, raws, raws == 1 ? " of another length" : "");
        refuse_call(h, call, INVALID_ARGUMENT, text);
        return;
    }
    if (!add_row(d, grpc_id(h->c->gen, call->stream, h->fd), KIND_GRPC, NULL, 0, header, header_len,
                 (const char *)raw, raw_len)) {
        refuse_call(h, call, RESOURCE_EXHAUSTED, "the front door holds as many images as it may; retry");
        return;
    }
    call->done = 1;
    drop_message(d, call); /* copied into the bulk */
}

/* The call's bearer token, or NULL (none, or one too long to have been kept: no token then). */
static const char *token(const call_t *call) {
    return call->auth_len && call->auth_len <= MAX_AUTH ? call->auth : NULL;
}

/* Whether the door asks for tokens and the call has none of them. */
static int no_token(door_t *d, const call_t *call) {
    return d->n_tokens && !(token(call) && token_ok(d, call->auth, call->auth_len));
}

#define MAX_GROUP_DEPTH 100 /* protobuf's default recursion limit */

/* Whether `n` bytes are UTF-8 as protobuf checks a string field's: no overlong form, surrogate or code point past
 * U+10FFFF. */
static int utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t more; /* continuation bytes after `c` */
        if (c < 0x80) more = 0;
        else if (c >= 0xc2 && c <= 0xdf) more = 1;
        else if (c >= 0xe0 && c <= 0xef) more = 2;
        else if (c >= 0xf0 && c <= 0xf4) more = 3;
        else return 0; /* a continuation byte first, an overlong lead (0xc0, 0xc1), or past U+10FFFF */
        if (n - i - 1 < more) return 0;
        for (size_t k = 1; k <= more; k++)
            if ((s[i + k] & 0xc0) != 0x80) return 0;
        uint8_t second = more ? s[i + 1] : 0;
        if ((c == 0xe0 && second < 0xa0) || (c == 0xed && second > 0x9f) || (c == 0xf0 && second < 0x90) ||
            (c == 0xf4 && second > 0x8f))
            return 0; /* overlong, a surrogate, past U+10FFFF */
        i += 1 + more;
    }
    return 1;
}

/* A model call's request (name = 1, version = 2, both strings) as protobuf's own serializer writes it, the way
 * Python keys its answers: fields in order, an empty one left out, the last of a repeated one kept, any other
 * field skipped (protobuf's parser keeps such a field as unknown, so the gRPC port answers the request as if it were
 * not there: a newer client's field, a group, or name sent as another wire type). 0 where protobuf's parser (upb)
 * refuses the bytes: a varint or a length past the end, a tag over 5 bytes or 32 bits, field 0, an end-group without
 * its start or a group left open, groups nested deeper than MAX_GROUP_DEPTH, wire type 6 or 7, a name or version
 * that is not UTF-8. `out` holds `len` bytes: the canonical form is never longer. */
static int canonical_model_request(const uint8_t *p, size_t len, uint8_t *out, size_t *out_len) {
    const uint8_t *field[3] = {NULL, NULL, NULL};
    uint64_t field_len[3] = {0, 0, 0}, tag, n;
    uint32_t open[MAX_GROUP_DEPTH]; /* the field numbers of the groups open, innermost last */
    int depth = 0;
    for (size_t at = 0; at < len;) {
        size_t tag_at = at;
        if (!varint(p, len, &at, &tag) || at - tag_at > 5 || tag > UINT32_MAX || tag >> 3 == 0) return 0;
        switch (tag & 7) {
        case 0: if (!varint(p, len, &at, &n)) return 0; continue;
        case 1: if (len - at < 8) return 0; at += 8; continue;
        case 5: if (len - at < 4) return 0; at += 4; continue;
        case 3: if (depth == MAX_GROUP_DEPTH) return 0; open[depth++] = (uint32_t)(tag >> 3); continue;
        case 4: if (!depth || open[--depth] != (uint32_t)(tag >> 3)) return 0; continue;
        case 2: break;
        default: return 0; /* 6, 7: not wire types */
        }
        if (!varint(p, len, &at, &n) || n > len - at) return 0;
        if (!depth && (tag == 0x0a || tag == 0x12)) { /* a group's fields are the group's, not the request's */
            if (!utf8(p + at, n)) return 0; /* a string field, each time it comes */
            field[tag >> 3] = p + at;
            field_len[tag >> 3] = n;
        }
        at += n;
    }
    if (depth) return 0;
    *out_len = 0;
    for (int f = 1; f <= 2; f++) {
        if (!field_len[f]) continue;
        out[(*out_len)++] = (uint8_t)(f << 3 | 2);
        for (n = field_len[f]; n >= 0x80; n >>= 7) out[(*out_len)++] = (uint8_t)(n | 0x80);
        out[(*out_len)++] = (uint8_t)n;
        memcpy(out + *out_len, field[f], field_len[f]);
        *out_len += field_len[f];
    }
    return 1;
}

/* Another call of the service: the answer Python set for this method and request. Python sets ModelReady for every
 * model the service serves, so one it has not set is of a model (or version) the service does not serve: not
 * ready, as Triton answers it (an empty ModelReadyResponse), so that a client polling for a load gets false, not an
 * error. The other model calls of a model the door does not serve are NOT_FOUND, as the gRPC port answers one it
 * does not serve; any other call UNIMPLEMENTED. */
static void answer_set(struct h2 *h, call_t *call, const uint8_t *request, size_t len) {
    uint8_t canonical[MAX_SMALL_MESSAGE];
    size_t canonical_len = 0;
    int model = len <= sizeof canonical && model_call(call);
    if (model && !canonical_model_request(request, len, canonical, &canonical_len)) {
        refuse_call(h, call, INVALID_ARGUMENT, "the request is not a model's name and version as protobuf writes them "
                    "(a length or a varint past its end, a tag too long, field 0, a group left open or closed "
                    "without its start, a field of no wire type, or a name or version not UTF-8)");
        return;
    }
    if (model) { /* the same request however a client's library wrote it */
        request = canonical;
        len = canonical_len;
    }
    char key[MAX_PATH + 1 + 2 * MAX_SMALL_MESSAGE + 1];
    memcpy(key, call->path, call->path_len);
    size_t n = call->path_len;
    key[n++] = '?';
    for (size_t i = 0; i < len; i++) n += (size_t)snprintf(key + n, 3, "%02x", request[i]);
    char *head = NULL, *body = NULL;
    size_t body_len = 0;
    int found = find_get(h->d, key, n, token(call), token(call) ? call->auth_len : 0, &head, &body, &body_len);
    if (found < 0) { /* an answer Python set for clients with a token (a model call's came without one: call_ended) */
        refuse_call(h, call, UNAUTHENTICATED, "the bearer token is missing or not one of the inference tokens"
                    TOKEN_EXPECTED);
        return;
    }
    if (!found && model && call_is(call, "ModelReady")) {
        static const char ok[] = "grpc-status: 0\r\n";
        respond(h, call, calloc(1, 1), 0, strdup(ok), sizeof ok - 1);
        return;
    }
    if (!found && model) {
        refuse_call(h, call, NOT_FOUND, "the front door serves no model of that name and version: it serves the "
                    "models of the default model's images, and the service's gRPC port serves every model");
        return;
    }
    if (!found) { refuse_call(h, call, UNIMPLEMENTED, NOT_SERVED); return; }
    respond(h, call, body, body_len, head, strlen(head)); /* the copies find_get made, the call's now */
}

/* A call's headers came: refused at once where no message could change the answer; a stream (ModelStreamInfer), at
 * its first message or request_s after its headers, whichever comes first (a client that never ends its side still
 * gets an answer). */
static void call_begun(struct h2 *h, call_t *call) {
    door_t *d = h->d;
    if (!call->post || !call->grpc) {
        refuse_call(h, call, INVALID_ARGUMENT, "the call is not a gRPC POST (content-type application/grpc)");
    } else if (call_is(call, "ModelStreamInfer")) {
        call->stream_call = 1;
    } else if (!call->path_len || memcmp(call->path, SERVICE, sizeof SERVICE - 1) != 0) {
        refuse_call(h, call, UNIMPLEMENTED, NOT_SERVED);
    } else if (call->infer && no_token(d, call)) {
        refuse_call(h, call, UNAUTHENTICATED,
                    call->auths > 1 ? "the bearer token is sent twice (`authorization` metadata more than once)"
                                      TOKEN_EXPECTED
                    : call->auth_len ? "the bearer token is not one of the inference tokens" TOKEN_EXPECTED
                                     : "the call has no bearer token" TOKEN_EXPECTED);
    }
}

/* The client's last frame of a call came: answered here, or its row taken. */
static void call_ended(struct h2 *h, call_t *call) {
    if (call->stream_call) { /* ended before its first message */
        refuse_call(h, call, UNIMPLEMENTED, NOT_SERVED);
        return;
    }
    if (model_call(call) && no_token(h->d, call)) { /* as the gRPC port: the token before anything of the message */
        refuse_call(h, call, UNAUTHENTICATED, "the bearer token is missing or not one of the inference tokens"
                    TOKEN_EXPECTED);
        return;
    }
    int infer = call->infer;
    const uint8_t *m = (const uint8_t *)call->message;
    uint32_t n = call->len >= 5 ? (uint32_t)m[1] << 24 | (uint32_t)m[2] << 16 | (uint32_t)m[3] << 8 | m[4] : 0;
    if (call->too_large) {
        refuse_call(h, call, INVALID_ARGUMENT,
                    infer ? "the message is larger than one image's uint8 pixels and its request: send batches, FP32 "
                            "and encoded images to the service's gRPC port"
                          : "the request is larger than the front door reads for this method");
        return;
    }
    if (call->len < 5 || n != call->len - 5) {
        refuse_call(h, call, INVALID_ARGUMENT, "the call's body is not one gRPC message (5-byte prefix, then its length)");
        return;
    }
    if (m[0] != 0) {
        refuse_call(h, call, UNIMPLEMENTED, "the front door takes uncompressed messages; send compressed ones to the "
                                            "service's gRPC port");
        return;
    }
    if (infer) take_infer(h, call, m + 5, n);
    else answer_set(h, call, m + 5, n);
}

static int on_begin_headers(nghttp2_session *s, const nghttp2_frame *frame, void *user_data) {
    struct h2 *h = user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    call_t *call = calloc(1, sizeof *call);
    if (!call) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* the stream is reset */
    call->stream = frame->hd.stream_id;
    call->since = now_s();
    call->next = h->calls;
    if (h->calls) h->calls->prev = call;
    h->calls = call;
    h->open++;
    nghttp2_session_set_stream_user_data(s, frame->hd.stream_id, call);
    return 0;
}

static int is(const uint8_t *name, size_t len, const char *want) {
    return len == strlen(want) && memcmp(name, want, len) == 0;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *frame, const uint8_t *name, size_t name_len,
                     const uint8_t *value, size_t value_len, uint8_t flags, void *user_data) {
    (void)flags; (void)user_data;
    call_t *call = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
    if (!call || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0; /* a client's trailers: nothing read */
    if (is(name, name_len, ":path")) { /* a longer one names no method served here: refused as such */
        call->path_len = value_len < MAX_PATH ? value_len : 0;
        memcpy(call->path, value, call->path_len);
        call->infer = value_len == sizeof INFER - 1 && memcmp(value, INFER, value_len) == 0;
    } else if (is(name, name_len, ":method")) {
        call->post = value_len == 4 && memcmp(value, "POST", 4) == 0;
    } else if (is(name, name_len, "content-type")) {
        call->grpc = value_len >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
                     (value_len == 16 || value[16] == '+' || value[16] == ';');
    } else if (is(name, name_len, "authorization")) {
        /* over MAX_AUTH, or a second one: not a token, and not copied */
        call->auth_len = ++call->auths > 1 ? MAX_AUTH + 1 : value_len;
        if (call->auth_len <= MAX_AUTH) memcpy(call->auth, value, value_len);
    }
    return 0;
}

static int on_data(nghttp2_session *s, uint8_t flags, int32_t stream, const uint8_t *data, size_t len,
                   void *user_data) {
    (void)flags;
    struct h2 *h = user_data;
    call_t *call = nghttp2_session_get_stream_user_data(s, stream);
    if (!call || call->too_large || call->done) return 0; /* dropped as it comes (refused once whole, or already) */
    if (call->stream_call) {
        refuse_call(h, call, UNIMPLEMENTED, NOT_SERVED);
        return 0;
    }
    size_t most = call->infer ? 5 + (size_t)h->d->row_bytes + MAX_V2_HEADER + 64 : 5 + MAX_SMALL_MESSAGE;
    if (call->len + len > most) {
        call->too_large = 1;
        drop_message(h->d, call);
        return 0;
    }
    if (call->len + len > call->cap) {
        /* The message's own length, where its prefix came whole (always, from real clients): one allocation of
         * what it says, at most `most`. Else grown as bytes come. */
        size_t cap = call->cap ? 2 * call->cap : 16384;
        if (!call->cap && len >= 5)
            cap = 5 + ((size_t)data[1] << 24 | (size_t)data[2] << 16 | (size_t)data[3] << 8 | data[4]);
        while (cap < call->len + len) cap *= 2;
        if (cap > most) cap = most;
        if (!hold_bytes(h->d, (int64_t)(cap - call->cap))) { /* the call is refused; the connection goes on */
            char text[160];
            snprintf(text, sizeof text, "request messages of %lld bytes are being received already; this one was "
                     "refused: retry (CGSERVE_MAX_INFLIGHT_BYTES)", (long long)h->d->max_held_bytes);
            drop_message(h->d, call);
            refuse_call(h, call, RESOURCE_EXHAUSTED, text); /* done: what more comes of it is dropped */
            return 0;
        }
        char *grown = realloc(call->message, cap);
        if (!grown) { /* the call is refused; the connection goes on */
            let_go_bytes(h->d, (int64_t)(cap - call->cap));
            refuse_call(h, call, RESOURCE_EXHAUSTED, "the server is out of memory for this call's message");
            return 0;
        }
        call->message = grown;
        call->cap = cap;
    }
    memcpy(call->message + call->len, data, len);
    call->len += len;
    return 0;
}

static int on_frame(nghttp2_session *s, const nghttp2_frame *frame, void *user_data) {
    struct h2 *h = user_data;
    if (frame->hd.type != NGHTTP2_DATA && frame->hd.type != NGHTTP2_HEADERS) return 0;
    call_t *call = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
    if (!call) return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) call_begun(h, call);
    if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM) || call->ended) return 0;
    call->ended = 1;
    if (!call->done) call_ended(h, call);
    return 0;
}

/* A call answered before the client's last frame (refused early, or not whole in time): its stream is
 * reset once the answer is out (RFC 9113 §8.1), so that it closes and what the client still sends is not read. */
static int on_sent(nghttp2_session *s, const nghttp2_frame *frame, void *user_data) {
    (void)user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) return 0;
    call_t *call = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
    if (call && !call->ended) nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, call->stream, NGHTTP2_NO_ERROR);
    return 0;
}

static void free_call(door_t *d, call_t *call) {
    drop_message(d, call);
    free(call->out);
    free(call->trailers);
    free(call);
}

static int on_close(nghttp2_session *s, int32_t stream, uint32_t error_code, void *user_data) {
    (void)error_code;
    struct h2 *h = user_data;
    call_t *call = nghttp2_session_get_stream_user_data(s, stream);
    if (!call) return 0;
    if (--h->open == 0) h->idle_since = now_s();
    if (call->prev) call->prev->next = call->next;
    else h->calls = call->next;
    if (call->next) call->next->prev = call->prev;
    free_call(h->d, call);
    return 0;
}

/* With c->mu held: what nghttp2 has to send, sent as far as the socket takes it; the rest waits in c->out. Closed
 * where the session is done (both sides' GOAWAY, or an error it answered), or where its client sent its last byte
 * and every call is answered. */
static void flush(door_t *d, conn_t *c, int fd) {
    struct h2 *h = c->h2;
    /* Its client's last byte came: out of epoll unless something waits to be sent (an answer's hand-over flushes). */
    uint32_t reading = c->eof ? 0 : EPOLLIN | EPOLLRDHUP;
    for (;;) {
        while (c->out_off < c->out_len) {
            ssize_t w = send(fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
            if (w > 0) { c->out_off += (size_t)w; h->stuck_since = 0; continue; }
            if (w < 0 && errno == EINTR) continue;
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                if (!(h->stuck_since > 0)) h->stuck_since = now_s(); /* the sweep's clock for a client that does not read */
                watch(c, fd, reading | EPOLLOUT);
                return;
            }
            close_conn(d, c, fd);
            return;
        }
        c->out_len = c->out_off = 0;
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(h->s, &data);
        if (n < 0) { close_conn(d, c, fd); return; }
        if (n == 0) break;
        ssize_t w;
        do w = send(fd, data, (size_t)n, MSG_NOSIGNAL); while (w < 0 && errno == EINTR);
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) { close_conn(d, c, fd); return; }
        if (w > 0) h->stuck_since = 0;
        if (w < n) { /* the rest, kept: nghttp2's pointer lives until its next call */
            size_t rest = (size_t)(n - (w > 0 ? w : 0));
            char *kept = malloc(rest);
            if (!kept) { close_conn(d, c, fd); return; }
            free(c->out);
            c->out = kept;
            memcpy(c->out, data + (n - (ssize_t)rest), rest);
            c->out_len = rest;
            c->out_off = 0;
        }
    }
    h->stuck_since = 0;
    if ((!nghttp2_session_want_read(h->s) && !nghttp2_session_want_write(h->s)) || (c->eof && h->open == 0)) {
        close_conn(d, c, fd);
        return;
    }
    watch(c, fd, reading);
}

int h2_open(door_t *d, conn_t *c, int fd) {
    struct h2 *h = calloc(1, sizeof *h);
    if (!h) return 0;
    h->d = d; h->c = c; h->fd = fd;
    h->idle_since = now_s();
    nghttp2_session_callbacks *callbacks;
    nghttp2_option *option;
    if (nghttp2_session_callbacks_new(&callbacks)) { free(h); return 0; }
    if (nghttp2_option_new(&option)) { nghttp2_session_callbacks_del(callbacks); free(h); return 0; }
    nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(callbacks, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, on_data);
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, on_frame);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, on_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(callbacks, on_sent);
    /* nghttp2's own guard against rapid resets ends a connection after 1,000 at once, then 33 a second: a busy
     * client whose calls time out or are cancelled would lose its connection. A guard stays (a call reset after
     * its row was taken still costs the GPU its row), sized for MAX_STREAMS calls at a time. */
    nghttp2_option_set_stream_reset_rate_limit(option, RESETS_BURST, RESETS_A_SECOND);
    int failed = nghttp2_session_server_new2(&h->s, callbacks, h, option);
    nghttp2_session_callbacks_del(callbacks);
    nghttp2_option_del(option);
    if (failed) { free(h); return 0; }
    /* A call's window holds its whole message (one image and its request), so that a client sends it at once;
     * the connection's, every call's at once. */
    int32_t call_window = 2 * (d->row_bytes + MAX_V2_HEADER) + 65535;
    /* The header list's bound said, as the gRPC port's (grpcio's 16 KiB), for a client to fail a call with more
     * metadata itself (grpc-go's does; grpcio's does not). A header field over nghttp2's own 64 KiB bound is a
     * connection error (HPACK's state is the connection's): every call on that connection fails with it. */
    nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)call_window},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST},
    };
    int64_t window = (int64_t)call_window * MAX_STREAMS;
    nghttp2_submit_settings(h->s, NGHTTP2_FLAG_NONE, settings, sizeof settings / sizeof *settings);
    nghttp2_session_set_local_window_size(h->s, NGHTTP2_FLAG_NONE, 0, window < (1 << 30) ? (int32_t)window : 1 << 30);
    c->h2 = h;
    return 1;
}

/* With c->mu held: an error nghttp2 could not answer with a GOAWAY of its own, or an idle connection: GOAWAY,
 * what is left sent as far as the socket takes it at once, and the connection closed. */
static void end_session(door_t *d, conn_t *c, int fd, uint32_t error) {
    nghttp2_session_terminate_session(c->h2->s, error);
    flush(d, c, fd); /* closes it once the GOAWAY is out */
    if (c->h2) close_conn(d, c, fd);
}

void h2_serve(door_t *d, conn_t *c, int fd) {
    struct h2 *h = c->h2;
    uint8_t buf[65536];
    for (int reads = 0; reads < READS_A_TURN && !c->eof; reads++) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r > 0) {
            if (nghttp2_session_mem_recv(h->s, buf, (size_t)r) < 0) { end_session(d, c, fd, NGHTTP2_PROTOCOL_ERROR); return; }
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r < 0 || h->open == 0) { close_conn(d, c, fd); return; } /* reset, or nothing left to answer */
        c->eof = 1; /* its last byte: its calls are still answered (flush closes it after the last) */
    }
    flush(d, c, fd);
}

void h2_reply(door_t *d, conn_t *c, reply_t *r) {
    struct h2 *h = c->h2;
    call_t *call = h && H2_GEN(c->gen) == r->gen ? nghttp2_session_get_stream_user_data(h->s, r->stream) : NULL;
    if (call && call->done && !call->trailers) { /* its row was taken, and it is not answered yet */
        respond(h, call, r->text, r->len, r->trailers, r->trailers_len); /* the reply's buffers, the call's now */
        flush(d, c, r->fd);
        return;
    }
    free(r->text);
    free(r->trailers);
}

/* The owning thread's look, every SWEEP_S: a drain's GOAWAY; a call not whole request_s after its headers refused
 * (DEADLINE_EXCEEDED, as HTTP's 408); a client that has not read what it was sent for request_s, or a connection
 * without calls for keepalive_s, closed (the idle one after a GOAWAY, so that its client sends no call into the
 * close). */
void h2_sweep(door_t *d, conn_t *c, int fd, double now) {
    struct h2 *h = c->h2;
    if (load(&d->draining) && !h->goaway) { /* calls up to the last one begun are answered; later ones are not read */
        h->goaway = 1;
        nghttp2_submit_goaway(h->s, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(h->s),
                              NGHTTP2_NO_ERROR, NULL, 0);
        flush(d, c, fd);
        return;
    }
    if (h->stuck_since > 0 && now - h->stuck_since > d->request_s) { close_conn(d, c, fd); return; }
    if (h->open == 0 && (h->goaway || now - h->idle_since > d->keepalive_s)) { end_session(d, c, fd, NGHTTP2_NO_ERROR); return; }
    int refused = 0;
    for (call_t *call = h->calls; call; call = call->next) {
        if (call->answered > 0 && now - call->answered > d->request_s) { /* a window the client never opens */
            end_session(d, c, fd, NGHTTP2_NO_ERROR);
            return;
        }
        if (!call->ended && !call->done && now - call->since > d->request_s) {
            if (call->stream_call)
                refuse_call(h, call, UNIMPLEMENTED, NOT_SERVED);
            else
                refuse_call(h, call, DEADLINE_EXCEEDED, "the call did not arrive whole in time");
            drop_message(d, call);
            refused = 1;
        }
    }
    if (refused) flush(d, c, fd);
}

void h2_free(conn_t *c) {
    struct h2 *h = c->h2;
    c->h2 = NULL;
    nghttp2_session_del(h->s);
    for (call_t *call = h->calls, *next; call; call = next) {
        next = call->next;
        free_call(h->d, call);
    }
    free(h);
}
