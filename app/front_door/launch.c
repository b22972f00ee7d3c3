/* The door's own launcher: the default model's POST /predict rows staged, replayed and answered in C, with no
 * Python between a request's last byte and its answer (issue 26 item 4).
 *
 * Why: for a small CNN, most of a request's time in the server is not on the device but in handing its row to
 * Python's event loop, batching there and handing the answers back. The door's threads with an engine in C and
 * nothing else (bench/front_door/door_echo.c) are the ceiling of this design; what each measured is in
 * bench/results/.
 *
 * What Python gives it (fd_direct_open, from app/front_door/launcher.py through door.py):
 * - SLOTS of the model's CUDA engine's slots, captured for it alone: per slot, its pinned (max_bucket, C, H, W)
 *   uint8 rows, which the graphs read; its pinned (max_bucket, width) fp32 scores, which they write; a graph
 *   executable per bucket; and the two events bracketing a batch;
 * - the engine's stream, and the CUDA context;
 * - the answer's fixed parts, as app/front_door/answers.py writes them.
 *
 * The three slots take turns:
 * - a door thread copies a request's pixels straight into the FILLING slot (direct_add). Where none is free, or
 *   it is full, the row goes to Python's bulk as every other request does;
 * - the launcher thread launches the filling slot the moment the device is done with the batch before it (or at
 *   once where the device is idle), then answers that batch while the new one runs: the device never waits for
 *   the answers;
 * - the answers are written here: each row's argmax, class name and scores, byte for byte orjson's (fmt_f32).
 *
 * Nothing waits for company: one row on an idle device is launched alone, as the batcher does.
 *
 * The launcher waits for a batch by polling its `done` event: spinning for SPIN_S, then sleeping between looks,
 * longer each time up to NAP_MOST_S. Never in the driver (cuEventSynchronize): a hung device would hold it there
 * for ever. A batch not done within the batch timeout, or a CUDA error, answers its rows with Python's failure
 * answer and stops the launcher: the device is dead, new rows go to Python, and Python's tending declares it so.
 *
 * Metrics: each answer's latency and each batch's rows, bucket and device seconds are kept in rings that Python
 * reads every tend (fd_direct_figures).
 *
 * CUDA is reached through the driver's library, opened at fd_direct_open: the door builds and runs without CUDA.
 */
#include "door.h" /* first: its _GNU_SOURCE */

#include <dlfcn.h>
#include <math.h>

#define SLOTS 3 /* app/service.py's LAUNCHER_SLOTS: the two change together */
#define MAX_BUCKETS 32
#define SPIN_S 0.002   /* longer than any batch of a small CNN; past it, nap between looks */
#define NAP_FIRST_S 0.00005
#define NAP_MOST_S 0.0005 /* a large model's batch takes milliseconds: its answers at most this much later */
#define LATENCIES (1 << 20) /* answers' latencies kept between two reads (5 s at 200,000 a second) */
#define BATCHES (1 << 16)
#define CUDA_NOT_READY 600

typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_graph_launch_t)(void *, void *);
typedef int (*cu_event_record_t)(void *, void *);
typedef int (*cu_event_query_t)(void *);
typedef int (*cu_event_elapsed_t)(float *, void *, void *);

enum { FREE = 0, FILLING = 1, RUNNING = 2, ANSWERING = 3, LOST = 4 };

typedef struct {
    uint8_t *in;        /* (max_bucket, C, H, W) uint8, pinned: what its graphs read */
    const float *out;   /* (max_bucket, width) fp32, pinned: what its graphs write */
    void *graphs[MAX_BUCKETS]; /* CUgraphExec of each bucket */
    void *start, *done; /* CUevent */
    int state, n, copying, bucket;
    double launched;
    uint64_t *ids;
    double *arrived;
} dslot_t;

typedef struct { int32_t rows, bucket; float seconds; } batch_fig_t;

/* One text laid out max_rows times, as fd_answer takes k answers: copy i is text[offsets[i]:offsets[i + 1]]. The
 * answers' parts that are the same for every row, laid out once at fd_direct_open; a batch hands fd_answer its
 * first k. */
typedef struct { char *text; int64_t *offsets; } repeated_t;

static repeated_t repeated(const char *text, int max_rows) {
    size_t len = strlen(text);
    repeated_t r = {malloc(len * (size_t)max_rows + 1), malloc(sizeof(int64_t) * ((size_t)max_rows + 1))};
    for (int i = 0; i <= max_rows; i++) {
        r.offsets[i] = (int64_t)(i * len);
        if (i < max_rows) memcpy(r.text + i * len, text, len);
    }
    return r;
}

static void free_repeated(repeated_t *r) {
    free(r->text);
    free(r->offsets);
    r->text = NULL;
    r->offsets = NULL;
}

struct direct {
    door_t *d;
    pthread_mutex_t mu; /* everything below but the launcher's own answer buffers */
    pthread_cond_t cv;
    dslot_t slots[SLOTS];
    int filling, running; /* slot indexes, or -1 */
    int n_buckets, buckets[MAX_BUCKETS], row_bytes, width;
    void *ctx, *stream, *cuda;
    cu_ctx_set_t ctx_set;
    cu_graph_launch_t launch;
    cu_event_record_t record;
    cu_event_query_t query;
    cu_event_elapsed_t elapsed;
    char *prefix, **names, *fail_status;
    size_t prefix_len, *name_lens;
    repeated_t json_heads, fail_heads, fail_bodies; /* each row's head lines, and the failure answer's parts */
    double timeout_s;
    int stop, sleeping, dead, joined;
    char why[256];
    double *latencies;
    uint64_t lat_n;  /* latencies kept since the last read (at most LATENCIES) */
    uint64_t lat_lost, batches_lost; /* not kept since the last read (a ring was full) */
    uint64_t failed;  /* rows answered with the failure answer since the last read */
    batch_fig_t *batch_figs;
    uint64_t batch_n;
    pthread_t tid;
    char *bodies; /* the launcher's: a batch's answers, body i at bodies[body_offsets[i]:body_offsets[i + 1]] */
    int64_t *body_offsets;
};

/* --- answers: orjson's float32, byte for byte ------------------------------------------------------------ */

/* The shortest decimal digits that read back as float32 `v` (> 0), and of those the closest to v: Ryu's, which orjson
 * writes. For each length p, the correctly rounded p digits, and where they do not read back (at a power of two,
 * where the floats below are twice as close as those above) the p-digit numbers either side of them. Exact, and
 * slow: up to ~15 printf and strtof calls a score, so that a batch's scores would take the launcher longer than the
 * device takes the batch (bench/front_door/fmt_f32_cost.c compares the two). fast_digits does the same in doubles
 * and comes here only where their rounding could decide. Into `digits` (no dot, no trailing
 * zeros); returns their count, and the decimal exponent of the first in *exponent. */
static int exact_digits(float v, char *digits, int *exponent) {
    char text[40];
    for (int p = 1; p <= 9; p++) {
        snprintf(text, sizeof text, "%.*e", p - 1, (double)v);
        long long m = 0;
        for (const char *c = text; *c != 'e'; c++)
            if (*c != '.') m = m * 10 + (*c - '0');
        int e = atoi(strchr(text, 'e') + 1) - (p - 1); /* v ≈ m × 10^e */
        long long best = -1;
        double best_gap = 0.0;
        for (int delta = 0; delta <= 2; delta++) { /* m, then m + 1 and m − 1 */
            long long candidate = m + (delta == 0 ? 0 : delta == 1 ? 1 : -1);
            if (candidate <= 0) continue;
            snprintf(text, sizeof text, "%llde%d", candidate, e);
            if (strtof(text, NULL) != v) continue;
            double gap = fabs(strtod(text, NULL) - (double)v);
            if (best < 0 || gap < best_gap) { best = candidate; best_gap = gap; }
            if (delta == 0) break; /* the correctly rounded one reads back: it is the closest */
        }
        if (best < 0) continue;
        int k = snprintf(digits, 16, "%lld", best);
        *exponent = e + k - 1;
        while (k > 1 && digits[k - 1] == '0') k--;
        return k;
    }
    return snprintf(digits, 16, "0"); /* not reached: 9 digits always read back */
}

/* x × 10^s in doubles: a power of ten is exact up to 10^22, so at most three roundings (relative 3.3e-16). */
static double scaled(double x, int s) {
    static const double tens[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    for (; s > 22; s -= 22) x *= 1e22;
    for (; s < -22; s += 22) x /= 1e22;
    return s >= 0 ? x * tens[s] : x / tens[-s];
}

/* Where a scaled value lies nearer than this to what decides (a rounding's half, an interval's end), the doubles'
 * error (at most 3.3e-16 × 1e9 = 3.3e-7) could decide it: exact_digits does. */
#define UNSURE 1e-6

/* Whether the correctly rounded p digits of x read back as x, from doubles: 1 or 0, or -1 where the doubles' error
 * could decide (then exact_digits must). Their value (× 10^-s) in *m. */
static int rounded_fits(double x, double lo, double hi, int top, int p, double *m, int *s) {
    *s = p - 1 - top;
    double at = scaled(x, *s), low = scaled(lo, *s), high = scaled(hi, *s);
    *m = floor(at + 0.5);
    if (fabs(at - floor(at) - 0.5) < UNSURE) return -1;                         /* a half: which way? */
    if (fabs(*m - low) < UNSURE || fabs(*m - high) < UNSURE) return -1;         /* on an end: in or out? */
    return *m > low && *m < high;
}

/* exact_digits' answer, from doubles. v's rounding interval (lo, hi) is exact in doubles (the midpoints to its
 * float32 neighbours). Away from a power of two it is symmetric, so where any p-digit number lies in it the correctly
 * rounded one does, and the p that fit are all those from the shortest up: a binary search finds it in four looks.
 * A power of two (its interval lopsided), and anything the doubles cannot decide, goes to exact_digits. */
static int fast_digits(float v, char *digits, int *exponent) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    if ((bits & 0x7fffff) == 0) return exact_digits(v, digits, exponent);
    double x = v, lo = ((double)nextafterf(v, 0.0f) + x) / 2, hi = ((double)nextafterf(v, INFINITY) + x) / 2;
    int top = (int)floor(log10(x)); /* the first digit's exponent */
    if (scaled(x, -top) >= 10.0) top++;
    if (scaled(x, -top) < 1.0) top--;
    int shortest = 9, least = 1, s = 0, s_best = 0;
    double m = 0.0, best = 0.0;
    int fits = rounded_fits(x, lo, hi, top, 9, &best, &s_best);
    if (fits <= 0) return exact_digits(v, digits, exponent); /* 9 digits always read back */
    while (least < shortest) { /* the shortest p that fits is in [least, shortest] */
        int p = (least + shortest) / 2;
        fits = rounded_fits(x, lo, hi, top, p, &m, &s);
        if (fits < 0) return exact_digits(v, digits, exponent);
        if (fits) { shortest = p; best = m; s_best = s; }
        else least = p + 1;
    }
    char reversed[16];
    int k = 0;
    for (long long n = (long long)best; n > 0; n /= 10) reversed[k++] = (char)('0' + n % 10);
    for (int i = 0; i < k; i++) digits[i] = reversed[k - 1 - i];
    *exponent = k - 1 - s_best;
    while (k > 1 && digits[k - 1] == '0') k--;
    return k;
}

/* `v` as orjson writes a numpy float32: the shortest digits (fast_digits); fixed notation from 1e-6 up to
 * below 1e13 (".0" after a whole number), else d[.ddd]e±n; NaN and infinities as null. Returns the length. */
int fmt_f32(char *out, float v) {
    if (isnan(v) || isinf(v)) { memcpy(out, "null", 4); return 4; }
    if (v == 0.0f) return signbit(v) ? (memcpy(out, "-0.0", 4), 4) : (memcpy(out, "0.0", 3), 3);
    int len = 0, n = 0;
    if (v < 0) { out[len++] = '-'; v = -v; }
    char digits[16] = "0";
    int k = fast_digits(v, digits, &n);
    if (n < -6 || n >= 13) {
        out[len++] = digits[0];
        if (k > 1) { out[len++] = '.'; memcpy(out + len, digits + 1, (size_t)k - 1); len += k - 1; }
        len += sprintf(out + len, "e%c%d", n < 0 ? '-' : '+', n < 0 ? -n : n);
    } else if (n < 0) {
        out[len++] = '0'; out[len++] = '.';
        for (int z = 0; z < -n - 1; z++) out[len++] = '0';
        memcpy(out + len, digits, (size_t)k); len += k;
    } else {
        for (int i = 0; i <= n; i++) out[len++] = i < k ? digits[i] : '0';
        out[len++] = '.';
        if (k > n + 1) { memcpy(out + len, digits + n + 1, (size_t)(k - n - 1)); len += k - n - 1; }
        else out[len++] = '0';
    }
    return len;
}

/* A row's answer to POST /predict, as answers.py's predictions() writes it; its length. `out` holds at least
 * prefix + names + 24 bytes a score. */
static size_t answer_body(struct direct *x, const float *scores, char *out) {
    int label = 0;
    for (int j = 0; j < x->width; j++) { /* numpy's argmax: the first largest, the first NaN where any */
        if (isnan(scores[j])) { label = j; break; }
        if (scores[j] > scores[label]) label = j;
    }
    size_t len = x->prefix_len;
    memcpy(out, x->prefix, len);
    len += (size_t)sprintf(out + len, "%d", label);
    memcpy(out + len, x->names[label], x->name_lens[label]);
    len += x->name_lens[label];
    for (int j = 0; j < x->width; j++) {
        if (j) out[len++] = ',';
        len += (size_t)fmt_f32(out + len, scores[j]);
    }
    memcpy(out + len, "]}]}", 4);
    return len + 4;
}

/* --- the door's side ------------------------------------------------------------------------------------- */

/* A POST /predict's pixels into the filling slot: 1, or 0 where the launcher cannot take it (no slot free, the
 * filling one full, the device dead or the launcher stopping): it goes to Python's bulk then. */
int direct_add(struct direct *x, uint64_t id, const char *body, size_t len) {
    if (len != (size_t)x->row_bytes) return 0;
    pthread_mutex_lock(&x->mu);
    if (x->dead || x->stop) { pthread_mutex_unlock(&x->mu); return 0; }
    int max_rows = x->buckets[x->n_buckets - 1];
    if (x->filling < 0 || x->slots[x->filling].n >= max_rows) {
        if (x->filling >= 0) { pthread_mutex_unlock(&x->mu); return 0; } /* full until launched: Python takes it */
        for (int s = 0; s < SLOTS && x->filling < 0; s++)
            if (x->slots[s].state == FREE) { x->filling = s; x->slots[s].state = FILLING; }
        if (x->filling < 0) { pthread_mutex_unlock(&x->mu); return 0; }
    }
    dslot_t *s = &x->slots[x->filling];
    int i = s->n++;
    s->ids[i] = id;
    s->arrived[i] = now_s();
    s->copying++;
    pthread_mutex_unlock(&x->mu);
    memcpy(s->in + (size_t)i * x->row_bytes, body, len); /* straight into the pinned memory the graph reads */
    pthread_mutex_lock(&x->mu);
    s->copying--;
    if (x->sleeping) pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
    return 1;
}

/* --- the launcher ---------------------------------------------------------------------------------------- */

static void stop_dead(struct direct *x, const char *why, int code) {
    pthread_mutex_lock(&x->mu);
    if (!x->dead) {
        x->dead = 1;
        snprintf(x->why, sizeof x->why, "%s (CUDA error %d)", why, code);
    }
    pthread_mutex_unlock(&x->mu);
}

static void answer_failed(struct direct *x, dslot_t *s) {
    int k = s->n;
    pthread_mutex_lock(&x->mu); /* counted before the answers go: a client that has one finds it counted */
    x->failed += (uint64_t)k;
    s->n = 0; /* and no longer pending */
    pthread_mutex_unlock(&x->mu);
    fd_answer(x->d, k, s->ids, x->fail_bodies.text, x->fail_bodies.offsets, x->fail_status, x->fail_heads.text,
              x->fail_heads.offsets);
}

static void answer_batch(struct direct *x, dslot_t *s, float seconds) {
    int k = s->n;
    size_t len = 0;
    for (int i = 0; i < k; i++) {
        x->body_offsets[i] = (int64_t)len;
        len += answer_body(x, s->out + (size_t)i * x->width, x->bodies + len);
    }
    x->body_offsets[k] = (int64_t)len;
    double now = now_s(); /* counted before the answers go: a client that has one finds it counted */
    pthread_mutex_lock(&x->mu);
    for (int i = 0; i < k; i++) {
        if (x->lat_n < LATENCIES) x->latencies[x->lat_n++] = now - s->arrived[i];
        else x->lat_lost++;
    }
    if (x->batch_n < BATCHES) x->batch_figs[x->batch_n++] = (batch_fig_t){k, s->bucket, seconds};
    else x->batches_lost++;
    s->n = 0; /* no longer pending */
    pthread_mutex_unlock(&x->mu);
    fd_answer(x->d, k, s->ids, x->bodies, x->body_offsets, "200 OK", x->json_heads.text, x->json_heads.offsets);
}

/* Whether the running batch is done: 1; 0 where it failed or outlived the timeout (the device is dead then). */
static int wait_done(struct direct *x, dslot_t *s) {
    double nap = NAP_FIRST_S;
    for (;;) {
        int r = x->query(s->done);
        if (r == 0) return 1;
        if (r != CUDA_NOT_READY) { stop_dead(x, "a batch of the front door's launcher failed", r); return 0; }
        double waited = now_s() - s->launched;
        if (waited > x->timeout_s) {
            stop_dead(x, "a batch of the front door's launcher did not complete within the batch timeout", 0);
            return 0;
        }
        if (waited > SPIN_S) { /* a long batch: nap, longer each time */
            struct timespec ts = {0, (long)(nap * 1e9)};
            nanosleep(&ts, NULL);
            nap = nap * 2 < NAP_MOST_S ? nap * 2 : NAP_MOST_S;
        }
    }
}

static int launch_slot(struct direct *x, dslot_t *s) {
    int b = 0;
    while (x->buckets[b] < s->n) b++; /* the smallest bucket that holds its rows */
    s->bucket = x->buckets[b];
    s->launched = now_s();
    int r = x->record(s->start, x->stream);
    if (!r) r = x->launch(s->graphs[b], x->stream);
    if (!r) r = x->record(s->done, x->stream);
    if (r) stop_dead(x, "the front door's launcher could not launch a batch", r);
    return r == 0;
}

static void *launcher(void *arg) {
    struct direct *x = arg;
    int r = x->ctx_set(x->ctx);
    if (r) stop_dead(x, "the front door's launcher could not use the CUDA context", r);
    pthread_mutex_lock(&x->mu);
    for (;;) {
        int has_rows = x->filling >= 0 && x->slots[x->filling].n > 0;
        if (x->running < 0 && !has_rows) {
            if (x->stop) break;
            x->sleeping = 1;
            pthread_cond_wait(&x->cv, &x->mu);
            x->sleeping = 0;
            continue;
        }
        int done = x->running, ok = 1;
        pthread_mutex_unlock(&x->mu);
        if (done >= 0) ok = wait_done(x, &x->slots[done]);
        pthread_mutex_lock(&x->mu);
        x->running = -1;
        if (done >= 0) x->slots[done].state = ok ? ANSWERING : LOST; /* a slot the device may still write: never reused */
        int next = -1;
        if (x->filling >= 0 && x->slots[x->filling].n > 0) {
            next = x->filling;
            x->filling = -1; /* new rows go to another free slot from now on */
            while (x->slots[next].copying > 0) { /* a row still being copied in */
                pthread_mutex_unlock(&x->mu);
                sched_yield();
                pthread_mutex_lock(&x->mu);
            }
            x->slots[next].state = RUNNING;
        }
        int dead = x->dead;
        pthread_mutex_unlock(&x->mu);
        if (next >= 0) {
            if (!dead && launch_slot(x, &x->slots[next])) {
                pthread_mutex_lock(&x->mu);
                x->running = next;
                pthread_mutex_unlock(&x->mu);
            } else {
                answer_failed(x, &x->slots[next]); /* which empties it */
                pthread_mutex_lock(&x->mu);
                x->slots[next].state = dead ? FREE : LOST;
                pthread_mutex_unlock(&x->mu);
            }
        }
        if (done >= 0) {
            dslot_t *s = &x->slots[done];
            float ms = 0.0f;
            if (ok) { /* each empties it */
                x->elapsed(&ms, s->start, s->done);
                answer_batch(x, s, ms / 1000.0f);
                pthread_mutex_lock(&x->mu);
                s->state = FREE;
                pthread_mutex_unlock(&x->mu);
            } else {
                answer_failed(x, s); /* LOST stays: the device may still write it */
            }
        }
        pthread_mutex_lock(&x->mu);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

/* --- Python's side --------------------------------------------------------------------------------------- */

/* The launcher for `d`, started: `buckets` (n_buckets, ascending); per slot s, ins[s] and outs[s] (pinned host
 * memory), graphs[s * n_buckets + b] (CUgraphExec), starts[s], dones[s] (CUevent); the engine's stream and the
 * context (CUstream, CUcontext); the answer's prefix (up to the label) and each class's part after the label;
 * the failure answer (status, head lines, body); `error`: why not, where NULL is returned. */
struct direct *fd_direct_open(door_t *d, int n_buckets, const int *buckets, void *const *ins, void *const *outs,
                              void *const *graphs, void *const *starts, void *const *dones, void *stream, void *ctx,
                              int width, const char *prefix, const char *const *names, const char *fail_status,
                              const char *fail_head, const char *fail_body, double timeout_s, char *error) {
    if (n_buckets < 1 || n_buckets > MAX_BUCKETS || width < 1 || d->direct) {
        strcpy(error, "out of range, or a launcher already open");
        return NULL;
    }
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        snprintf(error, 256, "libcuda.so.1: %s", dlerror());
        return NULL;
    }
    struct direct *x = calloc(1, sizeof *x);
    x->cuda = cuda;
    x->ctx_set = (cu_ctx_set_t)dlsym(cuda, "cuCtxSetCurrent");
    x->launch = (cu_graph_launch_t)dlsym(cuda, "cuGraphLaunch");
    x->record = (cu_event_record_t)dlsym(cuda, "cuEventRecord");
    x->query = (cu_event_query_t)dlsym(cuda, "cuEventQuery");
    x->elapsed = (cu_event_elapsed_t)dlsym(cuda, "cuEventElapsedTime");
    if (!x->ctx_set || !x->launch || !x->record || !x->query || !x->elapsed) {
        strcpy(error, "libcuda.so.1 lacks a function the launcher calls");
        dlclose(cuda);
        free(x);
        return NULL;
    }
    x->d = d;
    x->n_buckets = n_buckets;
    memcpy(x->buckets, buckets, sizeof(int) * (size_t)n_buckets);
    x->row_bytes = d->row_bytes;
    x->width = width;
    x->stream = stream;
    x->ctx = ctx;
    x->timeout_s = timeout_s;
    x->filling = x->running = -1;
    int max_rows = buckets[n_buckets - 1];
    for (int s = 0; s < SLOTS; s++) {
        dslot_t *slot = &x->slots[s];
        slot->in = ins[s];
        slot->out = outs[s];
        for (int b = 0; b < n_buckets; b++) slot->graphs[b] = graphs[s * n_buckets + b];
        slot->start = starts[s];
        slot->done = dones[s];
        slot->ids = malloc(sizeof(uint64_t) * (size_t)max_rows);
        slot->arrived = malloc(sizeof(double) * (size_t)max_rows);
    }
    x->prefix = strdup(prefix);
    x->prefix_len = strlen(prefix);
    x->names = calloc((size_t)width, sizeof(char *));
    x->name_lens = calloc((size_t)width, sizeof(size_t));
    size_t longest = 0;
    for (int j = 0; j < width; j++) {
        x->names[j] = strdup(names[j]);
        x->name_lens[j] = strlen(names[j]);
        if (x->name_lens[j] > longest) longest = x->name_lens[j];
    }
    x->fail_status = strdup(fail_status);
    x->json_heads = repeated("content-type: application/json\r\n", max_rows);
    x->fail_heads = repeated(fail_head, max_rows);
    x->fail_bodies = repeated(fail_body, max_rows);
    /* a row's answer at most: the prefix, a label, the longest name, a score's 15 bytes and a comma each, "]}]}" */
    x->bodies = malloc((x->prefix_len + longest + 32 + (size_t)width * 24) * (size_t)max_rows);
    x->body_offsets = malloc(sizeof(int64_t) * ((size_t)max_rows + 1));
    x->latencies = malloc(sizeof(double) * LATENCIES);
    x->batch_figs = malloc(sizeof(batch_fig_t) * BATCHES);
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    pthread_create(&x->tid, NULL, launcher, x);
    pthread_setname_np(x->tid, "cgserve-launch");
    __atomic_store_n(&d->direct, x, __ATOMIC_RELEASE); /* door threads hand it rows from now on */
    return x;
}

/* What happened since the last call: up to `most` latencies (seconds) into `latencies`, up to `most_batches`
 * (rows, bucket, device seconds) into the three arrays; counts[0] latencies, [1] batches, [2] latencies lost
 * since the last call (the ring was full), [3] rows not yet answered, [4] dead (why in `why`), [5] rows answered
 * with the failure answer since the last call, [6] batches not kept since the last call (their ring was full).
 * Valid until fd_direct_free, after the close too (its last figures). */
void fd_direct_figures(struct direct *x, double *latencies, int most, int32_t *rows, int32_t *buckets,
                       float *seconds, int most_batches, uint64_t *counts, char *why) {
    pthread_mutex_lock(&x->mu);
    memset(counts, 0, 7 * sizeof *counts);
    strcpy(why, x->why);
    if (!x->latencies) { /* closed */
        pthread_mutex_unlock(&x->mu);
        return;
    }
    uint64_t n = x->lat_n < (uint64_t)most ? x->lat_n : (uint64_t)most;
    memcpy(latencies, x->latencies, sizeof(double) * n);
    memmove(x->latencies, x->latencies + n, sizeof(double) * (x->lat_n - n));
    x->lat_n -= n;
    uint64_t m = x->batch_n < (uint64_t)most_batches ? x->batch_n : (uint64_t)most_batches;
    for (uint64_t i = 0; i < m; i++) {
        rows[i] = x->batch_figs[i].rows;
        buckets[i] = x->batch_figs[i].bucket;
        seconds[i] = x->batch_figs[i].seconds;
    }
    memmove(x->batch_figs, x->batch_figs + m, sizeof(batch_fig_t) * (x->batch_n - m));
    x->batch_n -= m;
    uint64_t pending = 0;
    for (int s = 0; s < SLOTS; s++)
        if (x->slots[s].state != LOST) pending += (uint64_t)x->slots[s].n;
    counts[0] = n;
    counts[1] = m;
    counts[2] = x->lat_lost;
    x->lat_lost = 0;
    counts[3] = pending;
    counts[4] = (uint64_t)x->dead;
    counts[5] = x->failed;
    x->failed = 0;
    counts[6] = x->batches_lost;
    x->batches_lost = 0;
    pthread_mutex_unlock(&x->mu);
}

/* No row is taken from now on (they go to Python's bulk); what it holds it still launches and answers. At once:
 * fd_direct_close waits for it. */
void fd_direct_stop(door_t *d, struct direct *x) {
    struct direct *expected = x;
    __atomic_compare_exchange_n(&d->direct, &expected, NULL, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&x->mu);
    x->stop = 1;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

/* fd_direct_stop, then the launcher's thread joined: 1 once it has ended, 0 where it had not within `timeout_s`
 * (it may then still answer through the door, which must not be freed: Python leaves it to the process's end).
 * One caller at a time (Python's close, on one thread); a second call after an ended one returns 1. */
int fd_direct_close(door_t *d, struct direct *x, double timeout_s) {
    fd_direct_stop(d, x);
    if (x->joined) return 1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double at = ts.tv_sec + ts.tv_nsec / 1e9 + timeout_s;
    ts.tv_sec = (time_t)at;
    ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
    if (pthread_clockjoin_np(x->tid, NULL, CLOCK_MONOTONIC, &ts) != 0) return 0;
    x->joined = 1;
    return 1;
}

/* A closed launcher's buffers freed, once its thread has ended (else nothing: left to the process's end). The
 * struct itself stays: a door thread that read d->direct before the close may yet look at it in direct_add (it
 * finds `stop` and takes nothing). */
void fd_direct_free(struct direct *x) {
    if (!x->joined) return;
    pthread_mutex_lock(&x->mu); /* emptied under the lock first: a figures call finds them gone, not freed */
    double *latencies = x->latencies;
    batch_fig_t *batch_figs = x->batch_figs;
    x->latencies = NULL;
    x->batch_figs = NULL;
    pthread_mutex_unlock(&x->mu);
    free(latencies); free(batch_figs); free(x->bodies); free(x->body_offsets);
    x->bodies = NULL;
    x->body_offsets = NULL;
    free_repeated(&x->json_heads); free_repeated(&x->fail_heads); free_repeated(&x->fail_bodies);
    dlclose(x->cuda);
}
