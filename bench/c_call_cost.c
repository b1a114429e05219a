/* The cost of one small call through Accord's C ABI: a 4-byte float allreduce, 200,000 times
 * after a warm-up, in microseconds per call (compare with `accord bench allreduce --sizes 4`).
 *
 *   crates/accord-c/install.sh PREFIX
 *   gcc -O2 bench/c_call_cost.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs accord) -o c_call_cost
 *   accord run -n 2 ./c_call_cost
 */
#include <accord.h>
#include <stdio.h>
#include <time.h>

int main(void) {
    accord_comm_t *c;
    if (accord_init(&c) != ACCORD_SUCCESS) {
        fprintf(stderr, "%s\n", accord_last_error());
        return 1;
    }
    float x = 1, y;
    const int n = 200000;
    for (int i = 0; i < 1000; i++) accord_allreduce(c, &x, &y, 1, ACCORD_FLOAT32, ACCORD_SUM, NULL);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; i++) accord_allreduce(c, &x, &y, 1, ACCORD_FLOAT32, ACCORD_SUM, NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double us = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n / 1000;
    printf("rank %d/%d: %.3f us per 4-byte allreduce through the C ABI\n", accord_comm_rank(c),
           accord_comm_size(c), us);
    accord_finalize(c);
    return 0;
}
