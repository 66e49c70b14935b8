// topk.cu — topk.c's ops on the CUDA provider: TopK and ortmod's Sort (csrc/ops/topk.c's semantics).
//
// Eager torch's order, ties included, is the order libstdc++'s algorithms leave on the CPU
// (csrc/ops/sort_order.h replays them step by step); the same replay runs here, one row per
// thread, so both providers give the same indices for any input. (Eager torch on a GPU
// orders ties its own way, by radix select and a segmented sort: ortmod follows the CPU.)
// Each row is copied into a scratch row in the math type (fp32 for fp16/bf16: the order of the
// converted values is the order of the originals) with its permutation; the values written
// out are the input's own elements. One thread per row is slow for long rows and few of them;
// it is exact, which a parallel selection with torch's CPU tie order would not easily be.
#include "common.cuh"
#include "ops/sort_order.h"

OM_SORT_ORDER_DEFINE(f32, float, static __device__)
OM_SORT_ORDER_DEFINE(f64, double, static __device__)
OM_SORT_ORDER_DEFINE(i32, int32_t, static __device__)
OM_SORT_ORDER_DEFINE(i64, int64_t, static __device__)

enum { SEL_TOPK, SEL_SORT, SEL_STABLE };

#define SELECT_ORDER(SFX, A)                                                                       \
    static __device__ void select_order(const A *v, int64_t *p, int64_t *tmp, int64_t n, int64_t k, \
                                        int mode, int desc, int sorted) {                          \
        if (mode == SEL_TOPK) om_so_topk_##SFX(v, p, n, k, desc, sorted);                          \
        else if (mode == SEL_SORT) om_so_sort_##SFX(v, p, n, desc);                                \
        else om_so_stable_sort_##SFX(v, p, tmp, n, desc);                                          \
    }
SELECT_ORDER(f32, float)
SELECT_ORDER(f64, double)
SELECT_ORDER(i32, int32_t)
SELECT_ORDER(i64, int64_t)

// x is (outer, n, inner); row r = (o, i) is x[o, :, i]; values and indices are (outer, k, inner).
// scratch: rows * n of A (row copies), rows * n int64 (permutations), and rows * n int64 for a
// stable sort's merges.
template <typename T>
__global__ void select_kernel(T *values, int64_t *indices, const T *x, typename acc<T>::t *rows_v, int64_t *perm,
                              int64_t *tmp, int64_t rows, int64_t n, int64_t k, int64_t inner, int mode, int desc,
                              int sorted) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(r, rows) {
        const int64_t o = r / inner, i = r % inner;
        const T *src = x + o * n * inner + i;
        A *row = rows_v + r * n;
        int64_t *p = perm + r * n;
        for (int64_t e = 0; e < n; e++) {
            row[e] = ld(src[e * inner]);
            p[e] = e;
        }
        select_order(row, p, tmp ? tmp + r * n : NULL, n, k, mode, desc, sorted);
        const int64_t dst = o * k * inner + i;
        for (int64_t e = 0; e < k; e++) {
            if (values) values[dst + e * inner] = src[p[e] * inner];
            if (indices) indices[dst + e * inner] = p[e];
        }
    }
}

om_status *select_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0];
    const int is_topk = !strcmp(omc_op_name(ctx), "TopK");
    if (X->rank == 0) return omc_err_unsupported(ctx, "a scalar input");
    const int axis = norm_axis(attr_i(ctx, "axis", -1), X->rank);
    if (axis < 0) return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s': axis out of range", omc_node_name(ctx));
    const int64_t n = X->dims[axis];
    int64_t k = n;
    if (is_topk) {
        int64_t kv[1];
        if (host_ints(ctx, x, 1, kv, 1) != 1) return omc_err_unsupported(ctx, "a K that is not known at plan time");
        k = kv[0];
        if (k < 0 || k > n) return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s': K = %lld for an axis of %lld",
                                           omc_node_name(ctx), (long long)k, (long long)n);
    }
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < X->rank; d++) {
        if (d < axis) outer *= X->dims[d];
        else if (d > axis) inner *= X->dims[d];
    }
    const int64_t rows = outer * inner;
    if (!rows || !k) return NULL;
    int mode, desc, sorted = 1;
    if (is_topk) {
        mode = SEL_TOPK;
        desc = attr_i(ctx, "largest", 1) != 0;
        sorted = attr_i(ctx, "sorted", 1) != 0;
    } else {
        mode = attr_i(ctx, "stable", 0) ? SEL_STABLE : SEL_SORT;
        desc = attr_i(ctx, "descending", 0) != 0;
    }
    void *values = wanted(ctx, 0) ? ctx->out[0].data : NULL;
    int64_t *indices = wanted(ctx, 1) ? (int64_t *)ctx->out[1].data : NULL;
    const size_t cells = (size_t)(rows * n);
    om_status *st = NULL;
    OMC_DISPATCH_ARITH(X->dtype, ctx, 0, {
        const size_t bytes = cells * (sizeof(A) + sizeof(int64_t) * (mode == SEL_STABLE ? 2 : 1));
        char *scratch = NULL;
        OMC_TRY(omc_temp_alloc(x, bytes, (void **)&scratch));
        int64_t *perm = (int64_t *)scratch;
        int64_t *tmp = mode == SEL_STABLE ? perm + cells : NULL;
        A *rows_v = (A *)(perm + cells * (mode == SEL_STABLE ? 2 : 1));
        select_kernel<T><<<grid_for(rows, 64), 64, 0, stream_of(x)>>>((T *)values, indices, (const T *)X->data, rows_v,
                                                                      perm, tmp, rows, n, k, inner, mode, desc, sorted);
        st = omc_launched(ctx);
        omc_temp_free(x, scratch);
    });
    return st;
}
