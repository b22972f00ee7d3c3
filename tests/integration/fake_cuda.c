/* A stand-in for CUDA's driver library (libcuda.so.1), for app/front_door/launch.c's tests on a machine without a
 * GPU. It is not a model of the GPU: it lets the tests drive launch.c's slots, answers, figures, close and failures.
 *
 * A "graph" is a fake_graph_t naming a slot's pinned rows and scores. Launching it scores each of its rows at
 * once: score j of a row is 1 / (its byte j + 3), so a test knows each request's answer from its own image (and
 * the scores are floats of every digit count, as a softmax's are, not a few dyadic ones). An
 * event is always done, unless fake_cuda_mode(HANG) says none ever is; under FAIL, every launch fails.
 *
 *   cc -shared -fPIC -Wl,-soname,libcuda.so.1 tests/integration/fake_cuda.c -o DIR/libcuda.so.1
 *
 * Loaded first (ctypes.CDLL), it is the libcuda.so.1 launch.c's dlopen finds: glibc matches the soname.
 */
#include <stdint.h>
#include <unistd.h>

typedef struct { const uint8_t *in; float *out; int rows, row_bytes, width; } fake_graph_t;
enum { WORKS = 0, FAIL = 1, HANG = 2 };
static volatile int mode = WORKS;
static volatile long launches = 0;

void fake_cuda_mode(int m) { mode = m; }
long fake_cuda_launches(void) { return launches; }
int cuCtxSetCurrent(void *context) { (void)context; return 0; }
int cuGraphLaunch(void *graph, void *stream) {
    (void)stream;
    if (mode == FAIL) return 999;
    const fake_graph_t *g = graph;
    for (int r = 0; r < g->rows; r++)
        for (int j = 0; j < g->width; j++)
            g->out[r * g->width + j] = 1.0f / (float)(g->in[(long)r * g->row_bytes + j] + 3);
    __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    return 0;
}
int cuEventRecord(void *event, void *stream) { (void)event; (void)stream; return 0; }
int cuEventQuery(void *event) { (void)event; return mode == HANG ? 600 : 0; } /* 600: CUDA_ERROR_NOT_READY */
/* As the driver's: it returns once the event is done, so under HANG not for 30 s. launch.c must never call it (a
 * hung device would hold its thread there for ever): the hang test fails if it does. */
int cuEventSynchronize(void *event) {
    (void)event;
    for (int i = 0; i < 3000 && mode == HANG; i++) usleep(10000);
    return 0;
}
int cuEventElapsedTime(float *ms, void *start, void *end) { (void)start; (void)end; *ms = 0.05f; return 0; }
