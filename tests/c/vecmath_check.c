/* vecmath_check.c — tests/test_vecmath.py's harness: sweeps float32 inputs (every STRIDE-th bit
 * pattern over the whole range) through vecmath.h's exp_f32_libm, in a loop the compiler
 * vectorizes as the kernels' loops are, and compares with the process's libm expf.
 * Prints "checked N differ D maxulp U". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/vecmath.h"

#define BLOCK 4096

__attribute__((noinline)) static void exp_block(const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] = exp_f32_libm(x[i]);
}

int main(int argc, char **argv) {
    const uint64_t stride = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    static float x[BLOCK], y[BLOCK];
    long checked = 0, differ = 0;
    int64_t maxulp = 0;
    int n = 0;
    for (uint64_t u = 0; u < (1ull << 32) + BLOCK * stride; u += stride) {
        const int last = u >= (1ull << 32);
        if (!last) {
            const uint32_t b = (uint32_t)u;
            memcpy(&x[n++], &b, 4);
        }
        if (n == BLOCK || (last && n)) {
            exp_block(x, y, n);
            for (int i = 0; i < n; i++) {
                const float want = expf(x[i]);
                checked++;
                if (memcmp(&want, &y[i], 4) == 0 || (want != want && y[i] != y[i])) continue;
                differ++;
                int32_t a, b;
                memcpy(&a, &want, 4);
                memcpy(&b, &y[i], 4);
                const int64_t d = llabs((int64_t)a - b);
                if (d > maxulp) maxulp = d;
                if (differ <= 5) fprintf(stderr, "x=%a expf=%a exp_f32_libm=%a\n", x[i], want, y[i]);
            }
            n = 0;
        }
        if (last) break;
    }
    printf("checked %ld differ %ld maxulp %lld\n", checked, differ, (long long)maxulp);
    return 0;
}
