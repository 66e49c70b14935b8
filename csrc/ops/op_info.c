/* op_info.c — the op table as the public API shows it (ortmod.h: om_op_table_entry), so that
 * a client lists the ops without om_op_def, whose layout is the engine's own. */
#include "ops/op.h"

int om_op_table_size(void) { return om_op_count(); }

bool om_op_table_entry(int i, const char **name, const char **domain, bool *has_gradient, const char **attrs) {
    const om_op_def *op = om_op_at(i);
    if (!op) return false;
    if (name) *name = op->name;
    if (domain) *domain = op->domain ? op->domain : "";
    if (has_gradient) *has_gradient = op->grad != NULL;
    if (attrs) *attrs = op->attrs ? op->attrs : "";
    return true;
}
