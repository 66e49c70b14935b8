/* nd_geom.h — the geometry of ONNX GatherND / ScatterND: index tuples of length k address
 * slices of data. Shared by the CPU kernels (ops/gather_nd.c) and the CUDA ones
 * (cuda/gather_nd.cu); plain C that nvcc also compiles.
 *
 * data is (d0 .. d[r-1]), indices is (i0 .. i[q-2], k), batch_dims b: the first b dims of
 * data and indices are batch dims and must be equal. Row q of indices (row-major over
 * i0 .. i[q-2]; batch bi = q / R) holds a tuple (t0 .. t[k-1]) that addresses the slice
 * data[bi.., t0, .., t[k-1], :, ..] of `slice` elements, which starts at element
 *     bi * batch_stride + sum_j t_j * stride[j]      (t_j wrapped: t_j < 0 means t_j + dim[j])
 * GatherND's output and ScatterND's updates are (rows, slice): row q's slice starts at q * slice.
 */
#ifndef OM_ND_GEOM_H
#define OM_ND_GEOM_H

#include <stdint.h>

/* included after ops/op.h (OM_MAX_RANK) */

typedef struct om_nd_geom {
    int k;                          /* the index tuple's length: indices' last dim */
    int64_t B;                      /* batches: prod(data dims [0, b)) */
    int64_t R;                      /* tuples per batch: prod(indices dims [b, q-1)) */
    int64_t slice;                  /* elements each tuple addresses: prod(data dims [b+k, r)) */
    int64_t batch_stride;           /* elements of data per batch: prod(data dims [b, r)) */
    int64_t dim[OM_MAX_RANK];    /* data dims b .. b+k-1 (what tuple entries index) */
    int64_t stride[OM_MAX_RANK]; /* their strides in elements */
} om_nd_geom;

/* Fills g from data dims (dd, r), indices dims (id, q) and batch_dims b. Returns NULL, or what
 * is wrong (the caller names node and op). The tuple values are not read here. */
static inline const char *om_nd_geometry(const int64_t *dd, int r, const int64_t *id, int q, int64_t b,
                                         om_nd_geom *g) {
    if (r < 1 || q < 1) return "data and indices must have rank >= 1";
    if (r > OM_MAX_RANK || q > OM_MAX_RANK) return "rank exceeds the engine's maximum";
    if (b < 0 || b >= (r < q ? r : q)) return "batch_dims must be >= 0 and below the ranks of data and indices";
    for (int i = 0; i < (int)b; i++)
        if (dd[i] != id[i]) return "the batch dims of data and indices differ";
    const int64_t k = id[q - 1];
    if (k < 1 || k > r - b) return "the last dim of indices (the tuple length) must be between 1 and rank(data) - batch_dims";
    if (q - 1 + (r - b - k) > OM_MAX_RANK) return "the result's rank exceeds the engine's maximum";
    g->k = (int)k;
    g->B = 1;
    for (int i = 0; i < (int)b; i++) g->B *= dd[i];
    g->R = 1;
    for (int i = (int)b; i < q - 1; i++) g->R *= id[i];
    g->slice = 1;
    for (int i = (int)(b + k); i < r; i++) g->slice *= dd[i];
    int64_t s = g->slice;
    for (int j = g->k - 1; j >= 0; j--) {
        g->dim[j] = dd[b + j];
        g->stride[j] = s;
        s *= dd[b + j];
    }
    g->batch_stride = s;
    return 0;
}

/* The output (or updates) shape for g: indices dims [0, q-1) then data dims [b+k, r). Returns
 * its rank. */
static inline int om_nd_rows_shape(const int64_t *dd, int r, const int64_t *id, int q, int64_t b, int k,
                                   int64_t *out) {
    int n = 0;
    for (int i = 0; i < q - 1; i++) out[n++] = id[i];
    for (int i = (int)(b + k); i < r; i++) out[n++] = dd[i];
    return n;
}
#endif
