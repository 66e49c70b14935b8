/* op_table.c — the one table of ops. Every other part of the engine finds ops here: by id
 * (om_op_id, ops/op_list.h), or by name and domain for the ONNX import. The ops are those of ops/op_list.h, which the CUDA provider's kernel
 * table is expanded from too: adding an op is its definition in the family file plus one
 * line there. Also here: the check of a node's attributes against what its op implements
 * (om_op_def.attrs). */
#include "ops/op.h"
#include "ops/op_list.h"

#include <stdio.h>
#include <stdlib.h>

#define OM_DECLARE(sym, name, domain, ...) extern const om_op_def sym;
OM_OP_LIST(OM_DECLARE, OM_DECLARE)

#define OM_ENTRY(sym, name, domain, ...) &sym,
static const om_op_def *const op_table[] = {OM_OP_LIST(OM_ENTRY, OM_ENTRY)};
_Static_assert(sizeof op_table / sizeof op_table[0] == OM_OP_COUNT, "one id per op table entry");

om_op_id om_op_find_id(const char *name, const char *domain) {
    if (!domain || strcmp(domain, "ai.onnx") == 0) domain = "";
    /* ORT exports its contrib ops under com.microsoft; ours of the same name serve them */
    int ms = strcmp(domain, "com.microsoft") == 0;
    for (size_t i = 0; i < sizeof op_table / sizeof op_table[0]; i++)
        if (strcmp(op_table[i]->name, name) == 0 &&
            (strcmp(op_table[i]->domain, domain) == 0 || (ms && strcmp(op_table[i]->domain, "ortmod") == 0)))
            return (om_op_id)i;
    return OM_OP_NONE;
}

const om_op_def *om_op_find(const char *name, const char *domain) { return om_op_get(om_op_find_id(name, domain)); }

const om_op_def *om_op_get(om_op_id id) { return id >= 0 && id < OM_OP_COUNT ? op_table[id] : NULL; }

#define OM_CHEAP(sym) [sym##_id] = 1,
static const unsigned char cheap[OM_OP_COUNT] = {OM_OP_CHEAP_LIST(OM_CHEAP)};
int om_op_cheap(om_op_id id) { return id >= 0 && id < OM_OP_COUNT && cheap[id]; }

int om_op_count(void) { return (int)(sizeof op_table / sizeof op_table[0]); }
const om_op_def *om_op_at(int i) { return i >= 0 && i < om_op_count() ? op_table[i] : NULL; }

/* ---- attributes: what an op implements (om_op_def.attrs) ---------------------------- */

/* One entry of an attrs list, as spans into it: "name:type" or "name:type=v1|v2". */
typedef struct attr_entry {
    const char *name, *type, *vals;   /* vals NULL: every value */
    size_t name_len, type_len, vals_len;
} attr_entry;

/* Finds name's entry in list; 0 when the op does not list it. */
static int attr_entry_find(const char *list, const char *name, attr_entry *e) {
    const size_t want = strlen(name);
    for (const char *p = list; p && *p;) {
        while (*p == ' ') p++;
        const char *end = p + strcspn(p, " ");
        const char *colon = memchr(p, ':', (size_t)(end - p));
        if (colon) {
            const char *eq = memchr(colon, '=', (size_t)(end - colon));
            e->name = p;
            e->name_len = (size_t)(colon - p);
            e->type = colon + 1;
            e->type_len = (size_t)((eq ? eq : end) - e->type);
            e->vals = eq ? eq + 1 : NULL;
            e->vals_len = eq ? (size_t)(end - eq - 1) : 0;
            if (e->name_len == want && memcmp(p, name, want) == 0) return 1;
        }
        p = end;
    }
    return 0;
}

static const char *attr_type_name(om_attr_type t) {
    switch (t) {
    case OM_ATTR_FLOAT: return "float";
    case OM_ATTR_INT: return "int";
    case OM_ATTR_STRING: return "string";
    case OM_ATTR_TENSOR: return "tensor";
    case OM_ATTR_FLOATS: return "floats";
    case OM_ATTR_INTS: return "ints";
    case OM_ATTR_STRINGS: return "strings";
    }
    return "?";
}

/* 1 when s is one of e's '|'-separated values. */
static int string_listed(const char *s, const attr_entry *e) {
    const char *p = e->vals, *stop = e->vals + e->vals_len;
    const size_t n = strlen(s);
    while (p <= stop) {
        const char *bar = memchr(p, '|', (size_t)(stop - p));
        const char *end = bar ? bar : stop;
        if ((size_t)(end - p) == n && memcmp(p, s, n) == 0) return 1;
        p = end + 1;
    }
    return 0;
}

/* 1 when a's value is one of e's '|'-separated values (int, float or string entries; a
 * strings attribute: each of its elements). */
static int attr_value_listed(const om_attr *a, const attr_entry *e) {
    if (a->type == OM_ATTR_STRINGS) {
        for (int i = 0; i < a->n; i++)
            if (!string_listed(a->strs[i], e)) return 0;
        return 1;
    }
    const char *p = e->vals, *stop = e->vals + e->vals_len;
    while (p <= stop) {
        const char *bar = memchr(p, '|', (size_t)(stop - p));
        const char *end = bar ? bar : stop;
        char v[64];
        size_t n = (size_t)(end - p);
        if (n < sizeof v) {
            memcpy(v, p, n);
            v[n] = 0;
            char *rest = NULL;
            switch (a->type) {
            case OM_ATTR_INT: {
                long long x = strtoll(v, &rest, 10);
                if (n && !*rest && x == a->i) return 1;
            } break;
            case OM_ATTR_FLOAT: {
                float x = (float)strtod(v, &rest);
                if (n && !*rest && x == a->f) return 1;
            } break;
            case OM_ATTR_STRING:
                if (a->s && strcmp(v, a->s) == 0) return 1;
                break;
            default: break;
            }
        }
        p = end + 1;
    }
    return 0;
}

om_status *om_node_check_attrs(const om_node *n) {
    const char *node = n->name ? n->name : "?", *op = n->op ? n->op->name : "?";
    for (int i = 0; i < n->n_attr; i++) {
        const om_attr *a = &n->attr[i];
        for (int j = 0; j < i; j++)
            if (strcmp(n->attr[j].name, a->name) == 0)
                return om_error(OM_INVALID_MODEL, "node '%s' (%s): attribute '%s' is given twice", node, op, a->name);
        attr_entry e;
        if (!n->op || !attr_entry_find(n->op->attrs, a->name, &e))
            return om_error(OM_UNSUPPORTED_OP, "node '%s' (%s): attribute '%s' is not implemented by ortmod", node,
                            op, a->name);
        const char *tn = attr_type_name(a->type);
        if (strlen(tn) != e.type_len || memcmp(tn, e.type, e.type_len) != 0)
            return om_error(OM_INVALID_MODEL, "node '%s' (%s): attribute '%s' is of type %s, but %s's %s is "
                            "of type %.*s", node, op, a->name, tn, op, a->name, (int)e.type_len, e.type);
        if (!e.vals || attr_value_listed(a, &e)) continue;
        char v[96];
        switch (a->type) {
        case OM_ATTR_INT: snprintf(v, sizeof v, "%lld", (long long)a->i); break;
        case OM_ATTR_FLOAT: snprintf(v, sizeof v, "%g", (double)a->f); break;
        case OM_ATTR_STRING: snprintf(v, sizeof v, "'%s'", a->s ? a->s : ""); break;
        case OM_ATTR_STRINGS:   /* the first element not listed */
            for (int k = 0; k < a->n; k++)
                if (!string_listed(a->strs[k], &e)) {
                    snprintf(v, sizeof v, "[..., '%s', ...]", a->strs[k]);
                    break;
                }
            break;
        default: snprintf(v, sizeof v, "this value"); break;
        }
        return om_error(OM_UNSUPPORTED_OP, "node '%s' (%s): attribute '%s' = %s is not implemented by ortmod "
                        "(it implements %.*s)", node, op, a->name, v, (int)e.vals_len, e.vals);
    }
    return NULL;
}
