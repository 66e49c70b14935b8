/* onnx_tensor.h — the protobuf side of ONNX shared by the importer, the exporter and the
 * runner (which reads the unpacked model itself): TensorProto -> om_tensor, and the check of
 * a whole ModelProto. */
#ifndef OM_ONNX_TENSOR_H
#define OM_ONNX_TENSOR_H
#include "core/core.h"
#include "onnx.pb-c.h"

/* Fills out with a copy of tp's data (om_alloc'd; the caller om_frees out->data). */
om_status *om_tensor_from_proto(const Onnx__TensorProto *tp, om_tensor *out);

/* Checks every field of mp that a reader relies on, before any is read: opset versions,
 * names (every value, node input/output and attribute has one; values are defined once,
 * before they are read), op types, tensor dims and their products (overflow-checked) against
 * the data each tensor holds, attribute names and
 * duplicate attributes. OM_INVALID_MODEL naming node, field and value; allocates only a
 * name table. */
om_status *om_onnx_check_model(const Onnx__ModelProto *mp);
#endif
