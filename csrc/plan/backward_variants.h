/* backward_variants.h — backward programs for calls where some output gradients are absent.
 *
 * Gradients are linear in the output gradients, so a backward node all of whose seed-derived
 * inputs are zero produces zero. For a call where some outputs have no gradient (outputs
 * outside the loss), such nodes are skipped: one whose zero output is still read gets its
 * output buffer zero-filled at its place in the program instead, and an input gradient that
 * is all zero is not returned at all. A plan builds each variant the first time a call needs
 * it and keeps it (per set of absent gradients) until the plan is freed.
 *
 *     const om_bwd_variant *var;
 *     OM_TRY(om_plan_backward_variant(g, plan, absent, &var));
 *     if (!var) run(plan->bwd_prog, plan->n_bwd_prog);        // every gradient is given
 *     else for each var->prog[s]: >= 0 run that node, < 0 zero-fill node -prog[s]-1's outputs;
 *          input i's gradient is handed back unless var->zero_grad[i]
 */
#ifndef OM_PLAN_BACKWARD_VARIANTS_H
#define OM_PLAN_BACKWARD_VARIANTS_H
#include "plan/plan.h"

typedef struct om_bwd_variant {
    int *prog;              /* node ids; a negative entry -(k+1) means: zero-fill node k's outputs */
    int n_prog;
    char *zero_grad;        /* per graph input: its gradient is zero (hand back none) */
    uint64_t present;       /* the key: bit i set when output i has a gradient */
    struct om_bwd_variant *next;   /* the plan's other variants */
} om_bwd_variant;

/* The backward program of p (built for g) for a call whose output gradients are absent where
 * absent[i] (per graph output) is nonzero. *out is NULL when the plan's own bwd_prog applies:
 * every output that has a gradient input is given one, or the model has more than 64 outputs
 * (absent gradients are then zero-filled seeds, run through the whole program). The variant
 * belongs to p. */
om_status *om_plan_backward_variant(const om_graph *g, om_plan *p, const char *absent, const om_bwd_variant **out);

/* Frees p's variants (om_plan_free calls it). */
void om_plan_free_variants(om_plan *p);
#endif
