/* op_attrs.c — the type the ops read each attribute as.
 *
 * The attribute lookups (om_attr_int, om_attr_ints, ...) return the default when the
 * attribute has another type, so a model that gives "axis" as a float would run with the
 * default axis: silently wrong. The importer checks every attribute of a model against this
 * table instead, once, and refuses a mismatch by node, attribute and type.
 *
 * One line per attribute name that any op reads. ONNX gives each of these names one type in
 * every op that has it, so the table is keyed by name alone. A test
 * (tests/test_hostile_input.py) reads the op sources and fails when an op reads a name that
 * is missing here. */
#include "ops/op.h"

static const struct { const char *name; om_attr_type type; } attr_types[] = {
    {"activation", OM_ATTR_STRING},       {"activation_alpha", OM_ATTR_FLOATS},
    {"activation_beta", OM_ATTR_FLOATS},  {"allowzero", OM_ATTR_INT},
    {"alpha", OM_ATTR_FLOAT},             {"approximate", OM_ATTR_STRING},
    {"auto_pad", OM_ATTR_STRING},         {"axes", OM_ATTR_INTS},
    {"axis", OM_ATTR_INT},                {"beta", OM_ATTR_FLOAT},
    {"causal", OM_ATTR_INT},              {"ceil_mode", OM_ATTR_INT},
    {"clip", OM_ATTR_FLOAT},              {"coerce2d", OM_ATTR_INT},
    {"count_include_pad", OM_ATTR_INT},   {"detect_negative", OM_ATTR_INT},
    {"detect_positive", OM_ATTR_INT},     {"dilations", OM_ATTR_INTS},
    {"direction", OM_ATTR_STRING},        {"end", OM_ATTR_INT},
    {"epsilon", OM_ATTR_FLOAT},           {"equation", OM_ATTR_STRING},
    {"exclusive", OM_ATTR_INT},           {"fmod", OM_ATTR_INT},
    {"function_id", OM_ATTR_INT},         {"gamma", OM_ATTR_FLOAT},
    {"group", OM_ATTR_INT},               {"hidden_size", OM_ATTR_INT},
    {"ignore_index", OM_ATTR_INT},        {"index", OM_ATTR_INT},
    {"input", OM_ATTR_INT},               {"input_dtypes", OM_ATTR_INTS},
    {"input_forget", OM_ATTR_INT},        {"inv", OM_ATTR_INT},
    {"k_transposed", OM_ATTR_INT},        {"keepdims", OM_ATTR_INT},
    {"kernel_shape", OM_ATTR_INTS},       {"layout", OM_ATTR_INT},
    {"linear_before_reset", OM_ATTR_INT}, {"mean", OM_ATTR_INT},
    {"mode", OM_ATTR_STRING},             {"momentum", OM_ATTR_FLOAT},
    {"nan_to_zero", OM_ATTR_INT},         {"noop_with_empty_axes", OM_ATTR_INT},
    {"output_dtypes", OM_ATTR_INTS},      {"pads", OM_ATTR_INTS},
    {"perm", OM_ATTR_INTS},               {"reduction", OM_ATTR_STRING},
    {"reverse", OM_ATTR_INT},             {"scale", OM_ATTR_FLOAT},
    {"split", OM_ATTR_INTS},              {"start", OM_ATTR_INT},
    {"storage_order", OM_ATTR_INT},       {"strides", OM_ATTR_INTS},
    {"to", OM_ATTR_INT},                  {"training_mode", OM_ATTR_INT},
    {"transA", OM_ATTR_INT},              {"transB", OM_ATTR_INT},
    {"upper", OM_ATTR_INT},               {"value", OM_ATTR_TENSOR},
    {"value_float", OM_ATTR_FLOAT},       {"value_floats", OM_ATTR_FLOATS},
    {"value_int", OM_ATTR_INT},           {"value_ints", OM_ATTR_INTS},
};

int om_attr_type_ok(const char *name, om_attr_type type, om_attr_type *want) {
    for (size_t i = 0; i < sizeof attr_types / sizeof attr_types[0]; i++) {
        if (strcmp(attr_types[i].name, name) != 0) continue;
        *want = attr_types[i].type;
        /* om_attr_float reads an int too (alpha=1 for alpha=1.0): the value is what was meant */
        return type == *want || (*want == OM_ATTR_FLOAT && type == OM_ATTR_INT);
    }
    *want = type;
    return 1;   /* no op reads it: its type cannot change a result */
}

const char *om_attr_type_name(om_attr_type type) {
    switch (type) {
    case OM_ATTR_FLOAT: return "float";
    case OM_ATTR_INT: return "int";
    case OM_ATTR_STRING: return "string";
    case OM_ATTR_TENSOR: return "tensor";
    case OM_ATTR_FLOATS: return "list of floats";
    case OM_ATTR_INTS: return "list of ints";
    }
    return "unknown";
}
