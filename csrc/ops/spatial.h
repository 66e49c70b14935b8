/* spatial.h — window geometry shared by conv.c and pool.c (Conv, MaxPool, AveragePool and
 * their backward ops): kernel/stride/dilation/padding per spatial dim, auto_pad and
 * ceil_mode resolved against concrete input sizes.
 *
 * Every geometry is canonicalized to 3 spatial dims (D, H, W): a 1-D op has D = H = 1,
 * a 2-D op has D = 1, with kernel 1, stride 1, dilation 1 and no padding on the added
 * dims. Kernels then have one code path for 1-D, 2-D and 3-D.
 */
#ifndef OM_SPATIAL_H
#define OM_SPATIAL_H

#include <stdio.h>
#include <string.h>

#include "ops/op.h"

#define OM_SP 3   /* canonical spatial rank */

typedef struct om_window {
    int nsp;                       /* the op's spatial rank (1..3) */
    int64_t N, C;                  /* batch and channels of the input */
    int64_t in[OM_SP];             /* input spatial sizes (canonical) */
    int64_t out[OM_SP];            /* output spatial sizes */
    int64_t k[OM_SP], s[OM_SP], d[OM_SP];
    int64_t pb[OM_SP], pe[OM_SP];  /* padding at the beginning / end */
} om_window;

static inline const char *om_sp_name(const om_node *n) { return n && n->name ? n->name : ""; }

/* The attributes om_window_init reads, for the attrs lists (op.h) of the windowed ops. */
#define OM_WINDOW_ATTRS \
    "auto_pad:string=NOTSET|SAME_UPPER|SAME_LOWER|VALID dilations:ints kernel_shape:ints pads:ints strides:ints"

/* Resolves the window of node n for input dims xd (rank xr = 2 + nsp). kshape: the kernel's
 * spatial dims (Conv: from W; pools: from the kernel_shape attribute); NULL reads the
 * attribute. ceil: ceil_mode (pools). */
static inline om_status *om_window_init(const om_node *n, int xr, const int64_t *xd, const int64_t *kshape,
                                        int ceil, om_window *w) {
    memset(w, 0, sizeof *w);
    const char *op = n->op ? n->op->name : "?";
    int nsp = xr - 2;
    if (nsp < 1 || nsp > OM_SP)
        return om_error(OM_UNSUPPORTED_OP, "%s node '%s': input rank %d (only 1-D, 2-D and 3-D windows: rank 3..5)",
                        op, om_sp_name(n), xr);
    w->nsp = nsp;
    w->N = xd[0];
    w->C = xd[1];
    const int64_t *ks = NULL, *st = NULL, *dl = NULL, *pd = NULL;
    int nk = om_attr_ints(n, "kernel_shape", &ks);
    int ns = om_attr_ints(n, "strides", &st);
    int nd = om_attr_ints(n, "dilations", &dl);
    int np = om_attr_ints(n, "pads", &pd);
    if (!kshape) {
        if (nk != nsp)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': kernel_shape must have %d values", op, om_sp_name(n), nsp);
        kshape = ks;
    } else if (nk >= 0 && nk != nsp) {
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': kernel_shape must have %d values", op, om_sp_name(n), nsp);
    }
    if ((ns >= 0 && ns != nsp) || (nd >= 0 && nd != nsp) || (np >= 0 && np != 2 * nsp))
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': strides/dilations need %d values and pads %d",
                        op, om_sp_name(n), nsp, 2 * nsp);
    const char *ap = om_attr_string(n, "auto_pad", "NOTSET");
    int same_upper = strcmp(ap, "SAME_UPPER") == 0, same_lower = strcmp(ap, "SAME_LOWER") == 0;
    int valid = strcmp(ap, "VALID") == 0;
    if (!same_upper && !same_lower && !valid && strcmp(ap, "NOTSET") != 0 && ap[0])
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': unknown auto_pad '%s'", op, om_sp_name(n), ap);
    int off = OM_SP - nsp;
    for (int i = 0; i < OM_SP; i++) {
        w->in[i] = w->out[i] = w->k[i] = w->s[i] = w->d[i] = 1;
        w->pb[i] = w->pe[i] = 0;
    }
    for (int i = 0; i < nsp; i++) {
        int c = off + i;
        w->in[c] = xd[2 + i];
        w->k[c] = kshape[i];
        w->s[c] = ns >= 0 ? st[i] : 1;
        w->d[c] = nd >= 0 ? dl[i] : 1;
        if (w->k[c] < 1 || w->s[c] < 1 || w->d[c] < 1)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': kernel, strides and dilations must be >= 1",
                            op, om_sp_name(n));
        const int64_t ext = w->d[c] * (w->k[c] - 1) + 1;   /* the dilated kernel's extent */
        if (same_upper || same_lower) {
            /* output = ceil(in / stride); the total padding splits with the odd one at the end
             * (SAME_UPPER) or the beginning (SAME_LOWER) */
            int64_t o = (w->in[c] + w->s[c] - 1) / w->s[c];
            int64_t tot = (o - 1) * w->s[c] + ext - w->in[c];
            if (tot < 0) tot = 0;
            w->pb[c] = same_upper ? tot / 2 : tot - tot / 2;
            w->pe[c] = tot - w->pb[c];
        } else if (!valid && np >= 0) {
            w->pb[c] = pd[i];
            w->pe[c] = pd[nsp + i];
            if (w->pb[c] < 0 || w->pe[c] < 0)
                return om_error(OM_INVALID_ARGUMENT, "%s node '%s': negative pads", op, om_sp_name(n));
        }
        /* eager's pooling_output_shape (ATen/native/Pool.h): floor((span + (ceil ? s - 1 : 0)) / s) + 1,
         * floor division; with ceil_mode the last window must start inside the input or its
         * leading padding. A ceil_mode window may run past the padded input, even when the
         * kernel's extent exceeds it (span < 0: input 2, pads 1 + 1, kernel 3 dilated by 2
         * has one window, its taps at -1, 1, 3); the kernels skip taps outside the input. */
        const int64_t span = w->in[c] + w->pb[c] + w->pe[c] - ext, num = span + (ceil ? w->s[c] - 1 : 0);
        int64_t o = (num >= 0 ? num / w->s[c] : -((-num + w->s[c] - 1) / w->s[c])) + 1;
        if (ceil && o > 0 && (o - 1) * w->s[c] >= w->in[c] + w->pb[c]) o--;
        if (o < 1) {
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': kernel extent %lld exceeds the padded input %lld "
                            "on spatial dim %d (stride %lld%s: no window)", op, om_sp_name(n), (long long)ext,
                            (long long)(w->in[c] + w->pb[c] + w->pe[c]), i, (long long)w->s[c],
                            ceil ? ", ceil_mode" : "");
        }
        w->out[c] = o;
    }
    return NULL;
}

/* ConvTranspose's window. ConvTranspose(X, W) is the input gradient of the convolution by W
 * of a Y-shaped input whose output is X-shaped, so the window is that convolution's:
 * w->N and w->C are Y's batch and channels (cout), w->in Y's spatial sizes
 *     in = (x - 1) * stride + dilation * (kernel - 1) + 1 - pad_begin - pad_end + output_padding
 * and w->out X's. The end pad is pad_end - output_padding: the output_padding positions at
 * Y's end are input positions of that convolution that no tap reaches inside X's extent.
 * It may be negative: pe only says how many outputs there are, which w->out holds already
 * (no kernel reads pe as padding). auto_pad: NOTSET or VALID (no padding); the SAME modes and
 * output_shape are refused by ConvTranspose's attrs list. kshape: W's spatial dims. */
static inline om_status *om_window_init_transposed(const om_node *n, int xr, const int64_t *xd, const int64_t *kshape,
                                                   int64_t cout, om_window *w) {
    memset(w, 0, sizeof *w);
    const char *op = n->op ? n->op->name : "?";
    const int nsp = xr - 2;
    if (nsp < 1 || nsp > OM_SP)
        return om_error(OM_UNSUPPORTED_OP, "%s node '%s': input rank %d (only 1-D, 2-D and 3-D windows: rank 3..5)",
                        op, om_sp_name(n), xr);
    w->nsp = nsp;
    w->N = xd[0];
    w->C = cout;
    const int64_t *ks = NULL, *st = NULL, *dl = NULL, *pd = NULL, *op_ = NULL;
    const int nk = om_attr_ints(n, "kernel_shape", &ks), ns = om_attr_ints(n, "strides", &st);
    const int nd = om_attr_ints(n, "dilations", &dl), np = om_attr_ints(n, "pads", &pd);
    const int no = om_attr_ints(n, "output_padding", &op_);
    if ((nk >= 0 && nk != nsp) || (ns >= 0 && ns != nsp) || (nd >= 0 && nd != nsp) || (no >= 0 && no != nsp) ||
        (np >= 0 && np != 2 * nsp))
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': kernel_shape/strides/dilations/output_padding need %d "
                        "values and pads %d", op, om_sp_name(n), nsp, 2 * nsp);
    const int valid = strcmp(om_attr_string(n, "auto_pad", "NOTSET"), "VALID") == 0;
    const int off = OM_SP - nsp;
    for (int i = 0; i < OM_SP; i++) w->in[i] = w->out[i] = w->k[i] = w->s[i] = w->d[i] = 1;
    for (int i = 0; i < nsp; i++) {
        const int c = off + i;
        if (nk >= 0 && ks[i] != kshape[i])
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': kernel_shape[%d] is %lld but W's is %lld", op,
                            om_sp_name(n), i, (long long)ks[i], (long long)kshape[i]);
        w->k[c] = kshape[i];
        w->s[c] = ns >= 0 ? st[i] : 1;
        w->d[c] = nd >= 0 ? dl[i] : 1;
        if (w->k[c] < 1 || w->s[c] < 1 || w->d[c] < 1)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': kernel, strides and dilations must be >= 1",
                            op, om_sp_name(n));
        const int64_t pb = np >= 0 && !valid ? pd[i] : 0, pe = np >= 0 && !valid ? pd[nsp + i] : 0;
        const int64_t opad = no >= 0 ? op_[i] : 0;
        if (pb < 0 || pe < 0 || opad < 0)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': negative pads or output_padding", op, om_sp_name(n));
        const int64_t x = xd[2 + i], ext = w->d[c] * (w->k[c] - 1) + 1;
        const int64_t y = x > 0 ? (x - 1) * w->s[c] + ext - pb - pe + opad : 0;
        if (x > 0 && y < 1)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': output size %lld on spatial dim %d (input %lld, "
                            "stride %lld, kernel extent %lld, pads %lld + %lld, output_padding %lld)", op,
                            om_sp_name(n), (long long)y, i, (long long)x, (long long)w->s[c], (long long)ext,
                            (long long)pb, (long long)pe, (long long)opad);
        w->in[c] = y;
        w->out[c] = x;
        w->pb[c] = pb;
        w->pe[c] = pe - opad;
    }
    return NULL;
}

/* Output dims (N, M, out...) into t (dtype dt). */
static inline void om_window_out_shape(const om_window *w, int64_t M, om_dtype dt, om_tensor *t) {
    t->dtype = dt;
    t->rank = 2 + w->nsp;
    t->dims[0] = w->N;
    t->dims[1] = M;
    for (int i = 0; i < w->nsp; i++) t->dims[2 + i] = w->out[OM_SP - w->nsp + i];
}

static inline int64_t om_window_in_size(const om_window *w) { return w->in[0] * w->in[1] * w->in[2]; }
static inline int64_t om_window_out_size(const om_window *w) { return w->out[0] * w->out[1] * w->out[2]; }
static inline int64_t om_window_k_size(const om_window *w) { return w->k[0] * w->k[1] * w->k[2]; }

/* The output positions o in [lo, hi) whose tap o*s + off lands inside [0, n). */
static inline void om_window_valid(int64_t n, int64_t s, int64_t off, int64_t nout, int64_t *lo, int64_t *hi) {
    int64_t l = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t h = n - off > 0 ? (n - off + s - 1) / s : 0;
    if (h > nout) h = nout;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* Copies every attribute of forward node `from` onto the last emitted node: the backward
 * ops of windowed ops carry the forward's kernel/strides/pads/auto_pad. */
static inline void om_copy_attrs(om_grad_ctx *c, int from) {
    int to = om_emit_last(c);
    if (to < 0) return;
    for (int i = 0; i < c->g->nodes[from].n_attr; i++) {
        const om_attr a = c->g->nodes[from].attr[i];   /* by value: setting may grow arrays */
        om_status *st = NULL;
        switch (a.type) {
        case OM_ATTR_INT: st = om_node_set_int(c->g, to, a.name, a.i); break;
        case OM_ATTR_FLOAT: st = om_node_set_float(c->g, to, a.name, a.f); break;
        case OM_ATTR_INTS: st = om_node_set_ints(c->g, to, a.name, a.ints, a.n); break;
        case OM_ATTR_STRING: st = om_node_set_string(c->g, to, a.name, a.s); break;
        default: break;
        }
        if (st) {
            om_grad_fail(c, st);
            return;
        }
    }
}

#endif
