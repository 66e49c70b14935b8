/* onnx_tensor.h — TensorProto ↔ om_tensor, shared by import and export. */
#ifndef OM_ONNX_TENSOR_H
#define OM_ONNX_TENSOR_H
#include "core/core.h"
#include "onnx.pb-c.h"

/* Fills out with a copy of tp's data (om_alloc'd; the caller om_frees out->data). */
om_status *om_tensor_from_proto(const Onnx__TensorProto *tp, om_tensor *out);
#endif
