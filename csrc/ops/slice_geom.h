/* slice_geom.h — ONNX Slice on one axis: clamp start and end to the axis as the spec says
 * (negative values count from the end; a negative step walks backwards) and count the
 * elements taken. Shared by the CPU kernels (ops/shape.c) and the CUDA ones
 * (cuda/shape.cu); plain C that nvcc also compiles. */
#ifndef OM_SLICE_GEOM_H
#define OM_SLICE_GEOM_H

#include <stdint.h>

/* Axis of size d, slice s:e:step (step != 0). Returns how many elements are taken and sets
 * *first to the index of the first one (0 when none are taken). Every value may be anything
 * an int64 holds (a model's INT64_MIN/INT64_MAX mean "from the end"/"to the end"): the count
 * is computed from the clamped distance, which fits, never as e - s + step. */
static inline int64_t om_slice_axis(int64_t s, int64_t e, int64_t step, int64_t d, int64_t *first) {
    int64_t cnt;
    if (s < 0) s += d;   /* d >= 0: no overflow for s < 0 */
    if (e < 0) e += d;
    if (step > 0) {
        s = s < 0 ? 0 : s > d ? d : s;
        e = e < 0 ? 0 : e > d ? d : e;
        cnt = e > s ? (e - s - 1) / step + 1 : 0;
    } else {
        s = s < 0 ? 0 : s > d - 1 ? d - 1 : s;
        e = e < -1 ? -1 : e > d - 1 ? d - 1 : e;
        /* s - e <= d; -step overflows for INT64_MIN, whose one step passes every axis */
        cnt = s > e ? (step == INT64_MIN ? 1 : (s - e - 1) / -step + 1) : 0;
    }
    if (d == 0) cnt = 0;
    *first = cnt ? s : 0;
    return cnt;
}
#endif
