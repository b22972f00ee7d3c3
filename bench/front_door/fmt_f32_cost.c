/* What launch.c's scores cost to write: fast_digits (doubles, the exact path only where they could not decide)
 * against exact_digits alone (printf and strtof at each length, what run 57a's launcher ran), over a million
 * softmax scores of random logits, in one run; and whether the two agree on every score.
 *
 *   cc -O2 -pthread -I app/front_door bench/front_door/fmt_f32_cost.c app/front_door/door.c app/front_door/grpc.c \
 *       -lnghttp2 -ldl -lm -o /tmp/fmt_f32_cost && /tmp/fmt_f32_cost
 */
#include "../../app/front_door/launch.c"

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void) {
    enum { N = 1000000, WIDTH = 10 };
    float *scores = malloc(N * sizeof *scores);
    srand(1);
    for (int i = 0; i < N; i += WIDTH) { /* softmax of logits uniform in [-25, 5): scores from ~1e-13 to 1 */
        double e[WIDTH], sum = 0;
        for (int j = 0; j < WIDTH; j++) sum += e[j] = exp((double)rand() / RAND_MAX * 30 - 25);
        for (int j = 0; j < WIDTH; j++) scores[i + j] = (float)(e[j] / sum);
    }
    char a[16], b[16];
    int ea = 0, eb = 0, differ = 0;
    double started = seconds_now();
    for (int i = 0; i < N; i++) fast_digits(scores[i], a, &ea);
    double fast = (seconds_now() - started) / N;
    started = seconds_now();
    for (int i = 0; i < N; i++) exact_digits(scores[i], b, &eb);
    double exact = (seconds_now() - started) / N;
    for (int i = 0; i < N; i++) {
        int ka = fast_digits(scores[i], a, &ea), kb = exact_digits(scores[i], b, &eb);
        differ += ka != kb || ea != eb || memcmp(a, b, (size_t)ka) != 0;
    }
    printf("{\"scores\": %d, \"fast_digits_ns\": %.1f, \"exact_digits_ns\": %.1f, \"differ\": %d}\n", N, fast * 1e9,
           exact * 1e9, differ);
    return differ != 0;
}
