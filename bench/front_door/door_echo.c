/* The front door with an ideal engine written in C: no Python, no event loop, no GPU. Issue 26 item 4's ceiling for
 * any design that keeps this door.
 *
 * door.c's threads serve the port as they do in the service. This program's main thread stands in for an engine
 * whose staging, launching and answering cost nothing. A stand-in device runs one batch at a time, each for
 * DEVICE_US whatever its rows. That is the seed CNN's shape: a batch of 42 rows took 0.09–0.10 ms on an H100 in
 * run 53d, a few kernels whose time hardly grows with the rows. The device's busy time is spent spinning.
 *
 * The moment a batch is done, the thread:
 * 1. takes the bulk the door has filled meanwhile;
 * 2. "launches" it, so the device is busy again;
 * 3. answers the batch just done, each request with one fixed body of the seed CNN's answer's length;
 * 4. spins until the new batch ends, or sleeps on the door's eventfd where nothing came.
 *
 * That is the order a C launch path would keep (the launch before the answers, so the device never waits for
 * them). Whatever such a path reaches with this device time, the service's own path cannot pass.
 *
 *   cc -O2 -pthread -I app/front_door bench/front_door/door_echo.c app/front_door/{door,grpc,launch}.c \
 *       -lnghttp2 -ldl -lm -o /tmp/door_echo
 *   taskset -c 0-7 /tmp/door_echo PORT THREADS DEVICE_US   # GET /readyz: 200; POST /predict: 784-byte bodies
 *
 * bench/front_door/sweep.py's --echo-us runs it beside the service's points, under the same load.
 */
#include "door.h"

door_t *fd_open(int lfd, int glfd, int threads, int row_bytes, int max_rows, int buffers, int efd, const char *path,
                int full_rows, int max_conns, double keepalive_s, double request_s, const char *tokens,
                long long max_held_bytes, long long max_pixels);
int fd_take(door_t *d, uint64_t *ids, double *arrived, char *headers, int32_t *header_ends, uint8_t *kinds,
            int32_t *lens, int *b);
void fd_release(door_t *d, int b);
void fd_answer(door_t *d, int k, const uint64_t *ids, const char *bodies, const int64_t *offsets,
               const char *status, const char *heads, const int64_t *head_offsets);
int fd_set_gets(door_t *d, int n, char *const *paths, char *const *heads, char *const *bodies, const int *body_lens,
                const int *tokens);

#define ROW_BYTES 784 /* the seed CNN's (1, 28, 28) uint8 image */
#define MOST_ROWS 1024 /* door.py's MOST_ROWS */
#define FULL_ROWS 64 /* the seed CNN's largest bucket: the eventfd is written again at this many */
#define BUFFERS 3 /* server.py's door_buffers at in_flight 2: one a batch in flight, one filling */
/* The seed CNN's answer to POST /predict, as the service writes it (its length is what matters here). */
static const char BODY[] =
    "{\"model\":\"fashion-cnn\",\"engine\":\"cuda-graph\",\"postprocess\":\"softmax\",\"predictions\":[{\"label\":9,"
    "\"class_name\":\"Ankle boot\",\"scores\":[1.2345678e-05,2.3456789e-06,3.4567891e-05,4.5678912e-06,"
    "5.6789123e-05,0.0012345678,6.7891234e-05,0.012345678,0.00023456789,0.98654321]}]}";
static const char HEAD[] = "content-type: application/json\r\n";

typedef struct {
    int k, buffer;
    uint64_t ids[MOST_ROWS];
} batch_t;

static batch_t batches[2];
static double arrived[MOST_ROWS];
static int32_t header_ends[MOST_ROWS], lens[MOST_ROWS];
static uint8_t kinds[MOST_ROWS];
static char bodies[MOST_ROWS * sizeof BODY], heads[MOST_ROWS * sizeof HEAD];
static int64_t body_offsets[MOST_ROWS + 1], head_offsets[MOST_ROWS + 1];

static void answer(door_t *d, batch_t *b) {
    fd_answer(d, b->k, b->ids, bodies, body_offsets, "200 OK", heads, head_offsets);
    fd_release(d, b->buffer);
    b->k = 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s PORT THREADS DEVICE_US\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]), threads = atoi(argv[2]);
    double device_s = atof(argv[3]) / 1e6;
    size_t body_len = sizeof BODY - 1, head_len = sizeof HEAD - 1;
    for (int i = 0; i < MOST_ROWS; i++) { /* every answer the same: laid out once */
        memcpy(bodies + i * body_len, BODY, body_len);
        memcpy(heads + i * head_len, HEAD, head_len);
    }
    for (int i = 0; i <= MOST_ROWS; i++) {
        body_offsets[i] = (int64_t)(i * body_len);
        head_offsets[i] = (int64_t)(i * head_len);
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd, (struct sockaddr *)&at, sizeof at) || listen(lfd, 4096)) {
        perror("door_echo: bind or listen");
        return 1;
    }
    int efd = eventfd(0, EFD_CLOEXEC); /* blocking: the engine sleeps on it when nothing is waiting */
    door_t *d = fd_open(lfd, -1, threads, ROW_BYTES, MOST_ROWS, BUFFERS, efd, "/predict", FULL_ROWS, 4096, 60.0, 30.0,
                        "", 1LL << 30, 1LL << 26);
    if (!d) {
        fprintf(stderr, "door_echo: fd_open refused %d threads\n", threads);
        return 1;
    }
    char *path = "/readyz", *ready_head = "200 OK\r\ncontent-type: text/plain\r\n", *ready = "ready";
    int ready_len = 5, no_token = 0;
    fd_set_gets(d, 1, &path, &ready_head, &ready, &ready_len, &no_token);
    char *headers = malloc((size_t)MOST_ROWS * MAX_V2_HEADER);
    fprintf(stderr, "door_echo: %d threads on 127.0.0.1:%d, a batch %.0f us on the stand-in device\n", threads, port,
            device_s * 1e6);
    double busy_until = 0.0;
    int running = -1; /* the batch on the stand-in device: batches[running], or none */
    for (;;) {
        while (running >= 0 && now_s() < busy_until) {} /* the device is busy */
        int next = running == 0 ? 1 : 0, b = 0;
        int k = fd_take(d, batches[next].ids, arrived, headers, header_ends, kinds, lens, &b);
        if (k > 0) { /* launched: the device is busy with it from now */
            batches[next].k = k;
            batches[next].buffer = b;
            busy_until = now_s() + device_s;
        }
        if (running >= 0) answer(d, &batches[running]); /* the batch just done */
        running = k > 0 ? next : -1;
        if (running < 0) { /* nothing in flight and nothing waiting: sleep until a row comes */
            uint64_t wakes;
            if (read(efd, &wakes, sizeof wakes) < 0 && errno != EINTR) {
                perror("door_echo: read");
                return 1;
            }
        }
    }
}
