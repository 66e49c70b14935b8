/* recompute.h — trade compute for memory: recompute forward values in the backward
 * instead of stashing them (ORTMODULE_MEMORY_OPT_LEVEL, as in ORT).
 *
 *   level 0: stash everything the gradient rules read (default).
 *   level 1: recompute cheap activations (elementwise ops, GELU, LayerNorm, reshapes) whose
 *            inputs the backward keeps anyway: the stash shrinks, the work barely grows.
 *   level 2: keep only layer boundaries (graph inputs, the inputs of LayerNormalization —
 *            the residual stream of a transformer — and random ops' outputs) and recompute
 *            everything else just before the backward needs it, layer by layer.
 */
#ifndef OM_RECOMPUTE_H
#define OM_RECOMPUTE_H
#include "ops/op.h"

/* Rewrites the joint graph g (after autodiff). *n_recomputed gets the number of forward
 * nodes cloned into the backward. */
om_status *om_recompute(om_graph *g, int level, int *n_recomputed);
#endif
