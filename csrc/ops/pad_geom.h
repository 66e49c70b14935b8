/* pad_geom.h — Pad's geometry, shared by the CPU (misc.c) and CUDA (cuda/misc.cu) kernels so
 * that both read pads, axes and mode the same way and pad with the same source indices.
 *
 * The caller reads pads (2 * na values) and axes (na values, normalized to [0, r)) from wherever
 * it keeps them (a plan-time tensor on the CPU, the planner's host copies on CUDA) and names the
 * node in errors through om_error / om_attr_string (cuda/misc.cu maps those onto its host table,
 * as conv.cu does for spatial.h). */
#ifndef OM_PAD_GEOM_H
#define OM_PAD_GEOM_H

#include <stdint.h>
#include <string.h>

#include "ops/op.h"

#ifdef __CUDACC__
#define OM_PAD_FN static inline __host__ __device__
#else
#define OM_PAD_FN static inline
#endif

enum { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP };

typedef struct pad_geom {
    int rank, mode;
    int64_t in[OM_MAX_RANK], out[OM_MAX_RANK], pb[OM_MAX_RANK];
} pad_geom;

/* g from x's dims (r, xd), np pads over na axes, and the node's mode attribute; checks what
 * ONNX leaves undefined (negative sizes, edge/wrap of an empty dim, reflect past the dim). */
static inline om_status *om_pad_geometry(const om_node *n, int r, const int64_t *xd, const int64_t *pads, int np,
                                         const int64_t *axes, int na, pad_geom *g) {
    const char *op = n->op ? n->op->name : "Pad", *name = n->name ? n->name : "";
    if (np != 2 * na)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': pads has %d values, expected %d", op, name, np, 2 * na);
    const char *mode = om_attr_string(n, "mode", "constant");
    g->mode = strcmp(mode, "constant") == 0 ? PAD_CONSTANT : strcmp(mode, "reflect") == 0 ? PAD_REFLECT
            : strcmp(mode, "edge") == 0 ? PAD_EDGE : strcmp(mode, "wrap") == 0 ? PAD_WRAP : -1;
    if (g->mode < 0) return om_error(OM_UNSUPPORTED_OP, "%s node '%s': mode '%s'", op, name, mode);
    g->rank = r;
    for (int i = 0; i < r; i++) {
        g->in[i] = g->out[i] = xd[i];
        g->pb[i] = 0;
    }
    for (int i = 0; i < na; i++) {
        const int a = (int)axes[i];
        /* pads are the model's data: bounded first, so that dim + begin + end cannot overflow
         * (dims are at most 2^60) */
        const int64_t lim = (int64_t)1 << 61;
        if (pads[i] > lim || pads[i] < -lim || pads[na + i] > lim || pads[na + i] < -lim)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': pads of axis %d (%lld, %lld) are out of range", op, name, a,
                            (long long)pads[i], (long long)pads[na + i]);
        g->pb[a] = pads[i];
        g->out[a] = xd[a] + pads[i] + pads[na + i];
        if (g->out[a] < 0) return om_error(OM_INVALID_ARGUMENT, "%s node '%s': negative output size", op, name);
        if (g->mode != PAD_CONSTANT && xd[a] == 0 && g->out[a] > 0)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': cannot %s-pad an empty dim", op, name, mode);
        if (g->mode == PAD_REFLECT && (pads[i] >= xd[a] || pads[na + i] >= xd[a]) && (pads[i] > 0 || pads[na + i] > 0))
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': reflect padding must be smaller than the dim", op, name);
    }
    return NULL;
}

/* Source index along one dim for output index o, or -1 (constant padding). */
OM_PAD_FN int64_t om_pad_src(int mode, int64_t o, int64_t pb, int64_t S) {
    int64_t i = o - pb;
    if (i >= 0 && i < S) return i;
    switch (mode) {
    case PAD_EDGE: return i < 0 ? 0 : S - 1;
    case PAD_REFLECT: {
        if (S == 1) return 0;
        const int64_t per = 2 * (S - 1);
        i %= per;
        if (i < 0) i += per;
        return i < S ? i : per - i;
    }
    case PAD_WRAP: i %= S; return i < 0 ? i + S : i;
    default: return -1;
    }
}

#endif
