/* optim_internal.h — what the optimizer kernels share: fp16/bf16 block loads and stores
 * (math is fp32; storage may be half), the multi-tensor range splitter, and a small pthread
 * parallel-for. Private to csrc/optim/. */
#ifndef OM_OPTIM_INTERNAL_H
#define OM_OPTIM_INTERNAL_H

#include "core/core.h"
#include "core/half.h"
#include "ortmod_optim.h"

#include <stdint.h>
#include <string.h>

/* fp16 / bf16 <-> fp32 (round to nearest even): core/half.h. */

/* Converts n values of dtype dt (f32, f16, bf16) at src to fp32 at dst, and back. */
static inline void om_load_f32(om_dtype dt, const void *src, float *restrict dst, int64_t n) {
    if (dt == OM_F16) {
        const uint16_t *restrict s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = om_f16_to_f32(s[i]);
    } else if (dt == OM_BF16) {
        const uint16_t *restrict s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = om_bf16_to_f32(s[i]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

static inline void om_store_f32(om_dtype dt, const float *restrict src, void *dst, int64_t n) {
    if (dt == OM_F16) {
        uint16_t *restrict d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = om_f32_to_f16(src[i]);
    } else if (dt == OM_BF16) {
        uint16_t *restrict d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = om_f32_to_bf16(src[i]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

/* Elements per block when half tensors are converted through fp32 stack buffers. */
#define OM_OPTIM_BLOCK 512

static inline int om_is_float_dtype(om_dtype dt) { return dt == OM_F32 || dt == OM_F16 || dt == OM_BF16; }

/* ---- multi-tensor ranges ---------------------------------------------------------
 * The n tensors of a call are seen as one concatenated range of elements; offsets[k] is
 * where tensor k starts (offsets[n] = total). A worker gets a global [begin, end) and
 * visits the tensor pieces inside it. */
typedef void (*om_piece_fn)(void *ctx, int tensor, int64_t lo, int64_t hi, int part);

void om_visit_pieces(const int64_t *offsets, int n, int64_t begin, int64_t end, int part, void *ctx, om_piece_fn fn);

/* ---- parallel for ------------------------------------------------------------------
 * Splits [0, total) into contiguous parts (multiples of 64 elements, each at least grain
 * elements; at most OM_OPTIM_MAX_PARTS, or the cap of om_options.optim_num_threads) and
 * runs fn on each, on the engine's thread pool. Parts are
 * numbered in order of begin. Returns the number of parts; fn(ctx, part, begin, end). */
#define OM_OPTIM_MAX_PARTS 64
typedef void (*om_range_fn)(void *ctx, int part, int64_t begin, int64_t end);
int om_parallel_for(int64_t total, int64_t grain, void *ctx, om_range_fn fn);

/* Checks what every optimizer kernel needs of a tensor: rank 0..OM_MAX_RANK, f32/f16/bf16
 * (f32 only when f32_only), data present when it has elements. what/i name it in errors. */
om_status *om_optim_check_tensor(const om_tensor *t, const char *what, int i, int f32_only);

/* The device of a call's tensors (lists of n tensors each; NULL lists skipped): all on the CPU
 * (*dev = NULL: the host runs the pass), or all on one device (*dev = its optimizer passes,
 * exec/optim_provider.h; *device its index). Tensors on different devices are an error naming
 * the first that differs. */
#include "exec/optim_provider.h"
om_status *om_optim_device(const char *what, int n, const om_tensor *const *lists, int n_lists,
                           const om_optim_provider **dev, int *device);

/* offsets[0..n] of n tensors (see om_visit_pieces); caller frees. */
om_status *om_optim_offsets(int n, const om_tensor *ts, int64_t **offsets);

#endif
