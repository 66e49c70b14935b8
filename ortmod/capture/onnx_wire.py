"""The few parts of an ONNX model that the TorchScript capture reads, straight from its bytes.

ortmod/capture/torchscript.py checks the graph torch.onnx.export wrote (its inputs, outputs and their element
types, the initializer names, the nodes with their inputs, outputs, integer attributes and
subgraphs) and adds graph outputs to it (training BatchNorm's running statistics). With the onnx
Python package that costs ``import onnx``, most of a second of every process's first call (onnx's
helpers pull in ml_dtypes); the protobuf wire format is simple enough to read those fields here.

    model = parse_model(onnx_bytes)
    model.graph.input[0].name, model.graph.input[0].elem_type
    for node in model.graph.node: node.op_type, node.domain, node.input, node.output, node.ints
    model.with_outputs([(name, elem_type, [dim_param, ...])])   # -> new model bytes

Field numbers are onnx.proto's (onnx/onnx.in.proto of the installed onnx package). Anything this
reader cannot follow (a malformed buffer, a group, a graph field given twice) raises ValueError:
the capture then fails by name, it never reads a partial graph.
"""

# wire types
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

# ModelProto
_MODEL_GRAPH = 7
# GraphProto
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 1, 5, 11, 12
# NodeProto
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP_TYPE, _NODE_ATTRIBUTE, _NODE_DOMAIN = 1, 2, 3, 4, 5, 7
# AttributeProto
_ATTR_NAME, _ATTR_I, _ATTR_G, _ATTR_GRAPHS, _ATTR_TYPE = 1, 3, 6, 11, 20
_ATTR_TYPE_INT = 2
# TensorProto
_TENSOR_NAME = 8
# ValueInfoProto, TypeProto, TypeProto.Tensor, TensorShapeProto, TensorShapeProto.Dimension
_VI_NAME, _VI_TYPE = 1, 2
_TYPE_TENSOR = 1
_TENSOR_TYPE_ELEM, _TENSOR_TYPE_SHAPE = 1, 2
_SHAPE_DIM = 1
_DIM_PARAM = 2

# TensorProto.DataType names, for messages (values as in onnx.proto)
DATA_TYPE_NAMES = ("UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING", "BOOL",
                   "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16",
                   "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4",
                   "FLOAT4E2M1", "FLOAT8E8M0", "UINT2", "INT2", "FLOAT6E2M3", "FLOAT6E3M2")


def data_type_name(elem_type):
    return DATA_TYPE_NAMES[elem_type] if 0 <= elem_type < len(DATA_TYPE_NAMES) else f"data type {elem_type}"


def _varint(buf, pos, end):
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("ONNX bytes: a truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf, start, end):
    """[(field number, wire type, value)] of one message: an int for varints, (start, end) of the
    payload for length-delimited fields, None for the fixed-width ones (not read here)."""
    out = []
    pos = start
    while pos < end:
        b = buf[pos]
        if b < 0x80:
            key, pos = b, pos + 1
        else:
            key, pos = _varint(buf, pos, end)
        wire = key & 7
        if wire == _LEN:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise ValueError("ONNX bytes: a field runs past its message")
            out.append((key >> 3, wire, (pos, pos + n)))
            pos += n
        elif wire == _VARINT:
            v, pos = _varint(buf, pos, end)
            out.append((key >> 3, wire, v))
        elif wire == _I64:
            pos += 8
            out.append((key >> 3, wire, None))
        elif wire == _I32:
            pos += 4
            out.append((key >> 3, wire, None))
        else:
            raise ValueError(f"ONNX bytes: wire type {wire} (a group) is not used by onnx.proto")
    if pos != end:
        raise ValueError("ONNX bytes: a field runs past its message")
    return out


def _str(buf, span):
    return buf[span[0]:span[1]].decode("utf-8")


def _int64(v):
    return v - (1 << 64) if v >= (1 << 63) else v


class Value:
    """A ValueInfoProto: its name and tensor element type (0: untyped or not a tensor)."""
    __slots__ = ("name", "elem_type")

    def __init__(self, name, elem_type):
        self.name = name
        self.elem_type = elem_type

    def __repr__(self):
        return f"Value({self.name!r}, {data_type_name(self.elem_type)})"


class Node:
    """A NodeProto: op_type, domain, name, input and output names, the INT attributes by name, and
    the graphs of its graph-valued attributes (If/Loop/Scan bodies)."""
    __slots__ = ("op_type", "domain", "name", "input", "output", "ints", "subgraphs")

    def __repr__(self):
        return f"Node({self.domain + '::' if self.domain else ''}{self.op_type} {self.name!r})"


class Graph:
    """A GraphProto: node, input and output lists, and the names of its (dense) initializers."""
    __slots__ = ("node", "input", "output", "initializer")


def _value_info(buf, span):
    name, elem = "", 0
    for f, w, v in _fields(buf, *span):
        if f == _VI_NAME and w == _LEN:
            name = _str(buf, v)
        elif f == _VI_TYPE and w == _LEN:
            for f2, w2, v2 in _fields(buf, *v):
                if f2 == _TYPE_TENSOR and w2 == _LEN:
                    for f3, w3, v3 in _fields(buf, *v2):
                        if f3 == _TENSOR_TYPE_ELEM and w3 == _VARINT:
                            elem = v3
    return Value(name, elem)


def _attribute(buf, span, node):
    name, i, kind, graphs = "", None, None, []
    for f, w, v in _fields(buf, *span):
        if f == _ATTR_NAME and w == _LEN:
            name = _str(buf, v)
        elif f == _ATTR_I and w == _VARINT:
            i = _int64(v)
        elif f == _ATTR_TYPE and w == _VARINT:
            kind = v
        elif f in (_ATTR_G, _ATTR_GRAPHS) and w == _LEN:
            graphs.append(_graph(buf, v))
    if i is not None and kind in (None, _ATTR_TYPE_INT):
        node.ints[name] = i
    node.subgraphs.extend(graphs)


def _node(buf, span):
    node = Node()
    node.op_type = node.domain = node.name = ""
    inputs, outputs = [], []
    node.ints = {}
    node.subgraphs = []
    for f, w, v in _fields(buf, *span):
        if w != _LEN:
            continue
        if f == _NODE_INPUT:
            inputs.append(_str(buf, v))
        elif f == _NODE_OUTPUT:
            outputs.append(_str(buf, v))
        elif f == _NODE_OP_TYPE:
            node.op_type = _str(buf, v)
        elif f == _NODE_DOMAIN:
            node.domain = _str(buf, v)
        elif f == _NODE_NAME:
            node.name = _str(buf, v)
        elif f == _NODE_ATTRIBUTE:
            _attribute(buf, v, node)
    node.input = tuple(inputs)
    node.output = tuple(outputs)
    return node


def _tensor_name(buf, span):
    name = ""
    for f, w, v in _fields(buf, *span):
        if f == _TENSOR_NAME and w == _LEN:
            name = _str(buf, v)
    return name


def _graph(buf, span):
    g = Graph()
    g.node, g.input, g.output, g.initializer = [], [], [], []
    for f, w, v in _fields(buf, *span):
        if w != _LEN:
            continue
        if f == _GRAPH_NODE:
            g.node.append(_node(buf, v))
        elif f == _GRAPH_INPUT:
            g.input.append(_value_info(buf, v))
        elif f == _GRAPH_OUTPUT:
            g.output.append(_value_info(buf, v))
        elif f == _GRAPH_INITIALIZER:
            g.initializer.append(_tensor_name(buf, v))
    return g


class Model:
    """A ModelProto's main graph, and the bytes it was read from."""

    def __init__(self, data):
        self.data = data
        spans = [(f, v) for f, w, v in _fields(data, 0, len(data)) if f == _MODEL_GRAPH and w == _LEN]
        if len(spans) != 1:
            # protobuf would merge several; torch writes one, and this reader does not merge
            raise ValueError(f"ONNX bytes: the model has {len(spans)} graph fields, expected one")
        self._graph_span = spans[0][1]
        self.graph = _graph(data, self._graph_span)

    def with_outputs(self, outputs):
        """The model's bytes with graph outputs added after the existing ones: ``outputs`` is
        [(name, elem_type, [dim_param per dim])] (what onnx.helper.make_tensor_value_info writes)."""
        start, end = self._graph_span
        graph = self.data[start:end] + b"".join(_field(_GRAPH_OUTPUT, _encode_value_info(*o)) for o in outputs)
        # the graph field's key and length precede its payload: find where the key starts
        key = _key(_MODEL_GRAPH, _LEN)
        head = start - len(_encode_varint(end - start)) - len(key)
        if self.data[head:start] != key + _encode_varint(end - start):
            raise ValueError("ONNX bytes: the graph field is not where it was read")
        return self.data[:head] + _field(_MODEL_GRAPH, graph) + self.data[end:]


def parse_model(data):
    """Reads ``data`` (ONNX ModelProto bytes) into a Model; ValueError if it cannot."""
    return Model(bytes(data))


def _encode_varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field, wire):
    return _encode_varint((field << 3) | wire)


def _field(field, payload):
    return _key(field, _LEN) + _encode_varint(len(payload)) + payload


def _encode_value_info(name, elem_type, dim_params):
    shape = b"".join(_field(_SHAPE_DIM, _field(_DIM_PARAM, p.encode("utf-8"))) for p in dim_params)
    tensor = _key(_TENSOR_TYPE_ELEM, _VARINT) + _encode_varint(elem_type) + _field(_TENSOR_TYPE_SHAPE, shape)
    return _field(_VI_NAME, name.encode("utf-8")) + _field(_VI_TYPE, _field(_TYPE_TENSOR, tensor))
