/* plan.h — what the engine runs for one set of concrete input shapes.
 *
 * Planning happens once per shape set and is cheap: shape inference of every node,
 * folding of everything known at plan time (constants, shapes and what derives from
 * them), dead-node removal, then the split into a forward and a backward program with a
 * storage class and an arena offset per value (liveness-based reuse, ggml-allocator style).
 *
 * A plan is device-neutral: what a provider needs to run it on its device is attached by the
 * executor (exec/device.h), which uses plan/; plan/ includes nothing from exec/.
 */
#ifndef OM_PLAN_H
#define OM_PLAN_H
#include "ops/op.h"

typedef enum om_storage {
    OM_ST_NONE = 0,   /* absent or never materialized */
    OM_ST_CONST,      /* initializer, or folded at plan time: plan-owned data */
    OM_ST_INPUT,      /* a graph input: the caller's memory */
    OM_ST_SEED,       /* dL/d(output): the caller's memory, or a zeroed backward-arena slot */
    OM_ST_FWD,        /* forward scratch, in the frame */
    OM_ST_STASH,      /* forward value the backward reads: one buffer per forward call */
    OM_ST_BWD,        /* backward scratch, in the frame */
    OM_ST_OUT,        /* a result handed to the caller: allocated fresh each call */
    OM_ST_ALIAS,      /* shares the memory of value alias_of (Reshape & co.) */
    OM_ST_EXTERN,     /* computed by an earlier segment's plan of the same call: in that plan's frame */
} om_storage;

/* Segments: plans of graphs whose sizes depend on values.
 *
 * A data-dependent node (OM_OP_DATA_DEPENDENT: NonZero) has an output size that only its
 * input's values give. With such nodes d_1..d_m (forward order) the graph runs in m+1
 * segments: segment 0 is the forward nodes before d_1, segment i the forward nodes from d_i
 * up to d_(i+1), and segment m also holds the whole backward (whose shapes depend on every
 * count). The plan of segment j is built once its j counts are known, and is cached under the
 * input shapes and those j counts (om_plan_matches): a call plans segment 0, runs it, asks d_1
 * for its count (om_op_def.count), finds or builds the plan of segment 1 for that count, runs
 * it, and so on (exec/engine.c).
 *
 * Each segment's plan places only its own values, in its own frame; what a later segment (or
 * the backward) reads of them stays where it was written (OM_ST_STASH, live to the end of the
 * frame) and the later plan reads it in place (OM_ST_EXTERN): nothing is copied at a boundary.
 * The price: the backward cannot reuse an earlier segment's dead bytes, and a plan cannot know
 * which of its values later segments leave unread (nodes past the segment are taken as live).
 * A graph without data-dependent nodes has one segment, planned exactly as before. */

typedef struct om_plan {
    int segment;                  /* which segment it runs: the number of counts it was built with */
    int last_segment;             /* 1 when it runs the graph's end (and the backward) */
    int64_t *extents;             /* [segment]: the data-dependent counts of d_1..d_segment (the key's rest) */
    int n_inputs;
    om_tensor *input_shapes;      /* the key: dtype/rank/dims per graph input */
    int n_values;
    om_tensor *vt;                /* per value: dtype, rank, dims; data set for OM_ST_CONST */
    om_storage *storage;
    size_t *offset;               /* into the frame */
    int *alias_of;
    int *bytes_of;                /* per value: the buffer whose bytes it took in place (itself if none) */
    char *owned;                  /* vt[v].data was allocated by the plan */
    int *fwd_prog, n_fwd_prog;    /* runtime node ids, in order */
    int *bwd_prog, n_bwd_prog;
    int *seed_of_output;          /* per graph output: the seed value (or -1) */
    size_t stash_size;            /* bytes of the per-forward frame: forward scratch, stash and
                                     backward scratch on one timeline (see plan.c) */
    size_t stash_value_bytes;     /* of which values kept from forward to backward (before reuse) */
    size_t twin_offset, twin_bytes; /* CPU: the frame's region for the fp32 twins of a node that computes
                                     in fp16/bf16 (om_cpu_run), one node at a time; 0 bytes if none */
    /* where the plan runs: the device of its inputs (all inputs share one) */
    om_device_type device;
    struct om_bwd_variant *variants; /* backward programs for calls where some output gradients are
                                     absent (zero): what they cannot reach is skipped
                                     (plan/backward_variants.h) */
    int device_id;
    /* CPU: the frame bytes that no later step of the call touches, per runtime node (CSR: the
     * ranges of node k are release_range[2*i], [2*i+1] (offset, bytes) for i in
     * release_at[k] .. release_at[k+1]-1): the executor hands their pages back to the system
     * after k ran (om_release_pages), so a frame's resident size follows its live buffers, as
     * eager PyTorch frees each saved tensor once backward used it (plan.c: release_schedule) */
    int *release_at;
    size_t *release_range;
    int n_release;                /* ranges in all */
    struct om_device_plan *device_data; /* plans on a device other than the CPU: what its provider
                                     needs to run them (kernels, uploaded constants), attached and
                                     released by the executor (exec/device.h); NULL on the CPU and
                                     opaque here: the planner knows no provider */
} om_plan;

/* Builds a plan for g (after autodiff) and these input shapes, on the inputs' device. A plan
 * for a device other than the CPU needs its device part too (om_device_plan_prepare) before it
 * runs. */
om_status *om_plan_build(const om_graph *g, const om_tensor *inputs, int n_inputs, bool has_backward,
                         const int64_t *extents, int n_known, om_plan **out);
/* Segment of every node (seg[k], for g->n_nodes nodes; NULL to skip) and the data-dependent
 * forward nodes in order (dd[i] is d_(i+1); NULL to skip); *n_dd gets m. A data-dependent node
 * in the backward (none today) is refused by name. */
om_status *om_plan_segments(const om_graph *g, int *seg, int *dd, int *n_dd);
/* Frees p and what the planner made for it (folded constants, backward variants). device_data
 * is not the planner's: release it first (om_device_plan_release). */
void om_plan_free(om_plan *p);
/* 1 when the plan was built for exactly these input dtypes, shapes and device. */
int om_plan_matches(const om_plan *p, const om_tensor *inputs, int n_inputs, const int64_t *extents, int n_known);
#endif
