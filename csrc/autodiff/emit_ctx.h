/* emit_ctx.h — the state behind an om_grad_ctx (private to autodiff/). */
#ifndef OM_EMIT_CTX_H
#define OM_EMIT_CTX_H
#include "autodiff/autodiff.h"

typedef struct om_grad_state {
    om_grad_ctx ctx;      /* first member: a rule's om_grad_ctx* is this struct */
    om_status *status;    /* first error a rule or helper hit */
    int last;             /* last node emitted */
} om_grad_state;
#endif
