/* autodiff.h — builds the backward graph from the ops' gradient rules. */
#ifndef OM_AUTODIFF_H
#define OM_AUTODIFF_H
#include "ops/op.h"

/* Appends backward nodes to g for the gradients of the graph inputs flagged in
 * grad_inputs (one flag per graph input). Sets g->n_fwd_nodes, g->grad_of_output (the
 * values the caller feeds with dL/d(output)) and g->grad_of_input. Gradients reaching a
 * value from several consumers are summed. A needed op without a gradient rule fails with
 * OM_NO_GRADIENT naming the op and the node. */
om_status *om_autodiff(om_graph *g, const bool *grad_inputs);

/* (om_dtype_is_float, in ops/op.h, says which dtypes carry gradients.) */
#endif
