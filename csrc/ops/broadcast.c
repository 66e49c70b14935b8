/* broadcast.c — shape helpers every op family uses (op.h) and the broadcast loop planner
 * (broadcast.h).
 *
 * Exports: om_broadcast_shape, om_set_shape, om_norm_axis, om_read_ints, om_err_dtype,
 *          om_check_dtype, om_check_float, om_err_unsupported, om_bcast_init.
 */
#include "ops/broadcast.h"

#include <stdio.h>

static const char *node_name(const om_node *n) { return n && n->name ? n->name : "?"; }
static const char *node_op(const om_node *n) { return n && n->op ? n->op->name : "?"; }

om_status *om_err_dtype(const om_node *n, int input, om_dtype got) {
    return om_error(OM_INVALID_ARGUMENT, "node '%s' (%s): input %d has unsupported dtype %s",
                    node_name(n), node_op(n), input, om_dtype_name(got));
}

om_status *om_check_dtype(const om_node *n, const om_tensor *t, int i, unsigned set) {
    return om_dtype_in(t->dtype, set) ? NULL : om_err_dtype(n, i, t->dtype);
}

om_status *om_check_float(const om_node *n, const om_tensor *t, int i, om_dtype want) {
    if (!om_dtype_is_float(t->dtype)) return om_err_dtype(n, i, t->dtype);
    if (want != OM_UNDEFINED && t->dtype != want)
        return om_error(OM_INVALID_ARGUMENT, "node '%s' (%s): input %d has dtype %s, expected %s", node_name(n),
                        node_op(n), i, om_dtype_name(t->dtype), om_dtype_name(want));
    return NULL;
}

om_status *om_check_shape_data(const om_node *n, int i, const int64_t *dims, int rank, om_dtype dt) {
    if (om_shape_size(dims, rank, om_dtype_size(dt), NULL, NULL) == 0) return NULL;
    om_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.rank = rank < 0 ? 0 : rank > OM_MAX_RANK ? OM_MAX_RANK : rank;
    memcpy(t.dims, dims, sizeof(int64_t) * (size_t)t.rank);
    char sh[160];
    om_shape_str(&t, sh, sizeof sh);
    return om_error(OM_INVALID_ARGUMENT, "%s node '%s': the shape in input %d, %s, is not one a tensor can have",
                    n->op ? n->op->name : "?", n->name ? n->name : "", i, sh);
}

om_status *om_err_unsupported(const om_node *n, const char *what) {
    return om_error(OM_UNSUPPORTED_OP, "node '%s' (%s): unsupported: %s", node_name(n), node_op(n),
                    what ? what : "?");
}

om_status *om_broadcast_shape(const om_tensor *a, const om_tensor *b, om_tensor *out) {
    int r = a->rank > b->rank ? a->rank : b->rank;
    if (r > OM_MAX_RANK)
        return om_error(OM_INVALID_ARGUMENT, "broadcast: rank %d exceeds %d", r, OM_MAX_RANK);
    int64_t dims[OM_MAX_RANK];
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - b->rank);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da == db || db == 1) dims[i] = da;
        else if (da == 1) dims[i] = db;
        else {
            char sa[128], sb[128];
            om_shape_str(a, sa, sizeof sa);
            om_shape_str(b, sb, sizeof sb);
            return om_error(OM_INVALID_ARGUMENT, "shapes %s and %s cannot be broadcast (axis %d: %lld vs %lld)",
                            sa, sb, i, (long long)da, (long long)db);
        }
    }
    /* out may alias a or b: write only after reading both. */
    out->rank = r;
    for (int i = 0; i < r; i++) out->dims[i] = dims[i];
    if (out->dtype == OM_UNDEFINED) out->dtype = a->dtype;
    return NULL;
}

void om_set_shape(om_tensor *out, const om_tensor *like, om_dtype dt) {
    int r = like->rank;
    int64_t dims[OM_MAX_RANK];
    for (int i = 0; i < r; i++) dims[i] = like->dims[i];
    out->rank = r;
    for (int i = 0; i < r; i++) out->dims[i] = dims[i];
    out->dtype = dt;
}

om_status *om_norm_axis(const om_node *n, int64_t axis, int rank, int *out) {
    int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= (rank > 0 ? rank : 1))
        return om_error(OM_INVALID_ARGUMENT, "node '%s' (%s): axis %lld is out of range for rank %d",
                        node_name(n), node_op(n), (long long)axis, rank);
    *out = (int)a;
    return NULL;
}

int om_read_ints(const om_tensor *t, int64_t *vals, int max) {
    if (!t || !t->data) return -1;
    int64_t n = om_tensor_numel(t);
    if (n > max || n < 0) return -1;
    if (t->dtype == OM_I64) {
        const int64_t *p = t->data;
        for (int64_t i = 0; i < n; i++) vals[i] = p[i];
    } else if (t->dtype == OM_I32) {
        const int32_t *p = t->data;
        for (int64_t i = 0; i < n; i++) vals[i] = p[i];
    } else {
        return -1;
    }
    return (int)n;
}

om_status *om_bcast_init(om_bcast *p, const om_node *node, const om_tensor *space,
                         const om_tensor *const *ops, int n_ops) {
    if (n_ops < 1 || n_ops > OM_BCAST_MAX_OPS)
        return om_error(OM_INTERNAL, "om_bcast_init: %d operands (max %d)", n_ops, OM_BCAST_MAX_OPS);
    const int R = space->rank;
    memset(p, 0, sizeof *p);
    p->n_ops = n_ops;

    /* Per-operand strides over the space's dims; 0 where the operand is broadcast. */
    int64_t st[OM_BCAST_MAX_OPS][OM_MAX_RANK];
    for (int k = 0; k < n_ops; k++) {
        const om_tensor *t = ops[k];
        if (t->rank > R) goto mismatch;
        int64_t s = 1;
        for (int d = R - 1; d >= 0; d--) {
            int od = d - (R - t->rank);
            int64_t dk = od >= 0 ? t->dims[od] : 1;
            if (dk == space->dims[d]) st[k][d] = dk == 1 ? 0 : s;
            else if (dk == 1) st[k][d] = 0;
            else goto mismatch;
            s *= dk;
        }
    }

    int64_t numel = 1;
    for (int d = 0; d < R; d++) numel *= space->dims[d];
    if (numel == 0) {
        p->rank = 0;
        p->inner = 1;
        p->n_outer = 0;
        for (int k = 0; k < n_ops; k++) p->step[k] = 1;
        return NULL;
    }

    /* Drop size-1 dims, then merge a dim into the one before it when every operand's
     * outer stride equals inner stride * inner extent (true for both contiguous and
     * stride-0 runs). */
    int m = 0;
    int64_t md[OM_MAX_RANK], ms[OM_BCAST_MAX_OPS][OM_MAX_RANK];
    for (int d = 0; d < R; d++) {
        if (space->dims[d] == 1) continue;
        int merge = m > 0;
        for (int k = 0; k < n_ops && merge; k++)
            if (ms[k][m - 1] != st[k][d] * space->dims[d]) merge = 0;
        if (merge) {
            md[m - 1] *= space->dims[d];
            for (int k = 0; k < n_ops; k++) ms[k][m - 1] = st[k][d];
        } else {
            md[m] = space->dims[d];
            for (int k = 0; k < n_ops; k++) ms[k][m] = st[k][d];
            m++;
        }
    }

    if (m == 0) {   /* a single element */
        p->rank = 0;
        p->inner = 1;
        p->n_outer = 1;
        for (int k = 0; k < n_ops; k++) p->step[k] = 1;
        return NULL;
    }
    /* The last merged dim becomes the inner run. A row-major operand's innermost stride
     * is 0 or 1; anything else would be a bug, handled by keeping the dim outer. */
    int inner_ok = 1;
    for (int k = 0; k < n_ops; k++)
        if (ms[k][m - 1] != 0 && ms[k][m - 1] != 1) inner_ok = 0;
    if (inner_ok) {
        p->inner = md[m - 1];
        for (int k = 0; k < n_ops; k++) p->step[k] = (int)ms[k][m - 1];
        m--;
    } else {
        p->inner = 1;
        for (int k = 0; k < n_ops; k++) p->step[k] = 0;
    }
    p->rank = m;
    p->n_outer = 1;
    for (int d = 0; d < m; d++) {
        p->dims[d] = md[d];
        p->n_outer *= md[d];
        for (int k = 0; k < n_ops; k++) p->stride[k][d] = ms[k][d];
    }
    return NULL;

mismatch: {
        char sp[128];
        om_shape_str(space, sp, sizeof sp);
        return om_error(OM_INVALID_ARGUMENT, "node '%s' (%s): an operand does not broadcast to %s",
                        node_name(node), node_op(node), sp);
    }
}
