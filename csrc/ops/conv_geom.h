/* conv_geom.h — a convolution's geometry and its checks (channels against W and group), shared
 * by the CPU (conv.c) and CUDA (cuda/conv.cu) kernels: the same shapes are accepted, and refused
 * with the same message, on both. Built on spatial.h's window (include that first, with its
 * om_error / om_attr_int, which cuda/conv.cu maps onto its host table). Plain C that C++ (nvcc)
 * also compiles. */
#ifndef OM_CONV_GEOM_H
#define OM_CONV_GEOM_H

#include "ops/spatial.h"

/* A convolution over w: M output channels in G groups of Mg, Cg input channels per group;
 * KS taps per window, IS input and OS output positions per image. */
typedef struct conv_geom {
    om_window w;
    int64_t M, G, Cg, Mg, KS, IS, OS;
} conv_geom;

/* A 1x1 window, stride 1, no padding: the image is its own im2col matrix. */
static inline int om_conv_window_trivial(const om_window *w) {
    for (int i = 0; i < OM_SP; i++)
        if (w->k[i] != 1 || w->s[i] != 1 || w->pb[i] || w->pe[i]) return 0;
    return 1;
}

static inline void om_conv_sizes(conv_geom *g) {
    g->Mg = g->M / g->G;
    g->KS = om_window_k_size(&g->w);
    g->IS = om_window_in_size(&g->w);
    g->OS = om_window_out_size(&g->w);
}

/* Conv (and its backward ops): x dims (xr, xd) and W's (wr, wd); checks channels and groups. */
static inline om_status *om_conv_geometry(const om_node *n, int xr, const int64_t *xd, int wr, const int64_t *wd,
                                          conv_geom *g) {
    if (wr != xr || xr < 3)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': X has rank %d and W rank %d (they must match, >= 3)",
                        n->op->name, om_sp_name(n), xr, wr);
    OM_TRY(om_window_init(n, xr, xd, wd + 2, 0, &g->w));
    g->G = om_attr_int(n, "group", 1);
    g->M = wd[0];
    if (g->G < 1 || xd[1] % g->G || g->M % g->G || wd[1] * g->G != xd[1])
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': X has %lld channels, W is (%lld, %lld, ...) with "
                        "group %lld: need C == W.dims[1] * group and M divisible by group", n->op->name,
                        om_sp_name(n), (long long)xd[1], (long long)wd[0], (long long)wd[1], (long long)g->G);
    g->Cg = wd[1];
    om_conv_sizes(g);
    return NULL;
}

/* ConvTranspose: the geometry of the convolution whose input gradient it is: its input is Y,
 * its output X, its weight W as it is (C_in, C_out/group, *K): M = C_in, Cg = C_out / group. */
static inline om_status *om_convt_geometry(const om_node *n, int xr, const int64_t *xd, int wr, const int64_t *wd,
                                           conv_geom *g) {
    if (wr != xr || xr < 3)
        return om_error(OM_INVALID_ARGUMENT, "ConvTranspose node '%s': X has rank %d and W rank %d (they must match, "
                        ">= 3)", om_sp_name(n), xr, wr);
    g->G = om_attr_int(n, "group", 1);
    if (g->G < 1 || xd[1] != wd[0] || wd[0] % g->G)
        return om_error(OM_INVALID_ARGUMENT, "ConvTranspose node '%s': X has %lld channels, W is (%lld, %lld, ...) "
                        "with group %lld: need C == W.dims[0], divisible by group", om_sp_name(n), (long long)xd[1],
                        (long long)wd[0], (long long)wd[1], (long long)g->G);
    OM_TRY(om_window_init_transposed(n, xr, xd, wd + 2, wd[1] * g->G, &g->w));
    g->M = wd[0];
    g->Cg = wd[1];
    om_conv_sizes(g);
    return NULL;
}

#endif
