/* slice_geom.h — ONNX Slice on one axis: clamp start and end to the axis as the spec says
 * (negative values count from the end; a negative step walks backwards) and count the
 * elements taken. Shared by the CPU kernels (ops/shape.c) and the CUDA ones
 * (cuda/shape.cu); plain C that nvcc also compiles. */
#ifndef OM_SLICE_GEOM_H
#define OM_SLICE_GEOM_H

#include <stdint.h>

/* Axis of size d, slice s:e:step (step != 0). Returns how many elements are taken and sets
 * *first to the index of the first one (0 when none are taken). */
static inline int64_t om_slice_axis(int64_t s, int64_t e, int64_t step, int64_t d, int64_t *first) {
    int64_t cnt;
    if (s < 0) s += d;
    if (e < 0) e += d;
    if (step > 0) {
        s = s < 0 ? 0 : s > d ? d : s;
        e = e < 0 ? 0 : e > d ? d : e;
        cnt = e > s ? (e - s + step - 1) / step : 0;
    } else {
        s = s < 0 ? 0 : s > d - 1 ? d - 1 : s;
        e = e < -1 ? -1 : e > d - 1 ? d - 1 : e;
        cnt = s > e ? (s - e - step - 1) / -step : 0;
    }
    if (d == 0) cnt = 0;
    *first = cnt ? s : 0;
    return cnt;
}
#endif
