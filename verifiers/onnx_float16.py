"""float16 arithmetic, emulated op by op on a CPU that computes float16 in float32.

onnxruntime's x86 CPU provider has no float16 kernels for most ops (Add, Mul, Pow, MatMul,
Softmax, ...): it casts their inputs to float32, computes there and, between two such ops, drops
the casts back and forth (its InsertCastTransformer). An intermediate value beyond float16's range
(65504) then never becomes Inf, as it does on a GPU or an ARM CPU with float16 kernels, and a
float16 model that overflows there passes on x86.

`emulated(model)` is the same graph in float32 with every value the model holds in float16 rounded
to float16 where it is made: each op that writes a float16 tensor computes in float32, and its
output goes through Cast to float16 (round to nearest even, Inf beyond the range) and back. Ops the
model keeps in float32 stay so; graph inputs and outputs keep their types. float16 weights stay
where they lie (in the model, or in the file a structure read without weights points at) and are
cast to float32 as the graph runs: the emulation holds no copy of them. Run without graph
optimizations (so no cast pair is folded away), it gives the values a float16 device gives for
ops computed in float32 and rounded once, which is how elementwise kernels and float16 matmuls
with float32 accumulation compute.

Every tensor keeps its name (but a float16 graph input's and output's), so the localisation of a
red run looks inside the emulation as inside the model (verifiers.localization.divergence: the
first op that overflows).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT16, FLOAT = TensorProto.FLOAT16, TensorProto.FLOAT
ROUNDED = "::float16"  # the float16 value of a tensor, between its two casts
COMPUTED = "::float32"  # an op's float32 result before rounding
HELD = "::as_float32"  # a float16 graph input or output, held in float32 inside the graph
STORED = "::stored_float16"  # a float16 weight as the file holds it, cast to float32 as the graph runs
# Ops whose outputs are int64 whatever they read (where onnx's shape inference says nothing).
_INTEGER_OUTPUTS = {"Shape", "Size", "ArgMax", "ArgMin", "NonZero"}


class NotEmulated(Exception):
    """The graph holds what the emulation does not rewrite (its message says what)."""


def computes_in_float16(model: onnx.ModelProto) -> bool:
    """Whether any op of the graph writes a float16 tensor (a float16-weight model that casts its
    weights to float32 at their first use computes in float32). A graph where nothing holds or
    names float16 (inputs, weights, attributes) cannot: it is answered without shape inference."""
    if not _names_float16(model.graph):
        return False
    types = _value_types(model)
    return any(types.get(output) == FLOAT16 for node in model.graph.node for output in node.output
               if node.op_type != "Constant")


def _names_float16(graph: onnx.GraphProto) -> bool:
    """Whether a graph input, a weight or an attribute (a Cast's `to`, a constant's value, a
    `dtype`) is float16: where every float16 value of a graph comes from."""
    if any(v.type.tensor_type.elem_type == FLOAT16 for v in graph.input) or any(
            t.data_type == FLOAT16 for t in graph.initializer):
        return True
    return any(_states_float16(attribute) or attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for node in graph.node for attribute in node.attribute)


def _states_float16(attribute: onnx.AttributeProto) -> bool:
    """Whether an attribute makes a value float16: a type (`to`, `dtype`) or a tensor it holds."""
    return (attribute.type == onnx.AttributeProto.INT and attribute.name in ("to", "dtype") and attribute.i == FLOAT16
            or attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == FLOAT16)


def emulated(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model in float32 with its float16 values rounded where they are made (see the module's
    docstring). Every tensor keeps its name, now holding float32 (the rounded value); a float16
    graph input is cast to `name::as_float32` first, and a float16 graph output is cast back from it."""
    graph = model.graph
    for node in graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise NotEmulated(f"{node.op_type} {node.name or node.output[0]} holds a subgraph")
    types = _value_types(model)
    ends = {value.name for value in (*graph.input, *graph.output) if types.get(value.name) == FLOAT16}
    held = {name: name + HELD if name in ends else name for name, kind in types.items() if kind == FLOAT16}
    nodes, initializers = [], []
    for value in graph.input:
        if value.name in held:
            nodes.append(helper.make_node("Cast", [value.name], [held[value.name]], to=FLOAT,
                                          name=f"{value.name}::input_to_float32"))
    for tensor in graph.initializer:
        initializers.append(tensor)
        if tensor.name in held:  # a float16 weight, read as it lies (in the file, or its data) and cast at run time
            stored = onnx.TensorProto()
            stored.CopyFrom(tensor)
            stored.name = tensor.name + STORED
            initializers[-1] = stored
            nodes.append(helper.make_node("Cast", [stored.name], [tensor.name], to=FLOAT,
                                          name=f"{tensor.name}::weight_to_float32"))
    for node in sorted_nodes(graph):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [held.get(name, name) for name in node.input]
        _float_attributes(copy)
        written = [name for name in node.output if name in held]
        if node.op_type == "Constant":  # its value, now float32, is float16's exactly
            copy.output[:] = [held.get(name, name) for name in node.output]
            nodes.append(copy)
            continue
        copy.output[:] = [name + COMPUTED if name in held else name for name in node.output]
        nodes.append(copy)
        for name in written:
            nodes.append(helper.make_node("Cast", [name + COMPUTED], [name + ROUNDED], to=FLOAT16,
                                          name=f"{name}::round_to_float16"))
            nodes.append(helper.make_node("Cast", [name + ROUNDED], [held[name]], to=FLOAT,
                                          name=f"{name}::back_to_float32"))
    for value in graph.output:
        if value.name in held:
            nodes.append(helper.make_node("Cast", [held[value.name]], [value.name], to=FLOAT16,
                                          name=f"{value.name}::output_to_float16"))
    rewritten = helper.make_model(
        helper.make_graph(nodes, graph.name, list(graph.input), list(graph.output), initializers),
        opset_imports=list(model.opset_import), ir_version=model.ir_version)
    rewritten.functions.extend(model.functions)
    return rewritten


def sorted_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes in an order where each comes after those it reads (onnxruntime runs a graph out of
    order; the emulation's ops are listed in the order they run), the file's order kept otherwise."""
    made = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [node for node in pending if all(name in made for name in node.input)]
        if not ready:  # a cycle, or a name nothing makes: left in the file's order for the runtime to refuse
            return ordered + pending
        for node in ready:
            made.update(node.output)
        ordered.extend(ready)
        pending = [node for node in pending if node not in ready]
    return ordered


def _float_attributes(node: onnx.NodeProto) -> None:
    """A float16 type or value an attribute states, made float32."""
    for attribute in node.attribute:
        if not _states_float16(attribute):
            continue
        if attribute.type == onnx.AttributeProto.INT:
            attribute.i = FLOAT
        else:
            attribute.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attribute.t).astype(np.float32),
                                                         attribute.t.name))


def _value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Every value's element type: onnx's shape inference where it knows, else what the op says
    (a Cast its `to`, a Constant its value) or its first float input's type."""
    graph = model.graph
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:  # noqa: BLE001 - an op onnx does not know: its types follow from its inputs below
        inferred = graph
    types = {value.name: value.type.tensor_type.elem_type
             for value in (*inferred.input, *inferred.output, *inferred.value_info)
             if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type}
    types.update({tensor.name: tensor.data_type for tensor in graph.initializer})
    for node in graph.node:
        stated = _stated_type(node, types)
        for name in node.output:
            if name and name not in types and stated is not None:
                types[name] = stated
    return types


def _stated_type(node: onnx.NodeProto, types: dict[str, int]) -> int | None:
    attributes = {a.name: a for a in node.attribute}
    if node.op_type == "Cast" and "to" in attributes:
        return attributes["to"].i
    if node.op_type in ("Constant", "ConstantOfShape") and "value" in attributes:
        return attributes["value"].t.data_type
    if node.op_type in _INTEGER_OUTPUTS:
        return TensorProto.INT64
    floats = [types[name] for name in node.input if types.get(name) in (FLOAT16, FLOAT, TensorProto.DOUBLE,
                                                                          TensorProto.BFLOAT16)]
    return floats[0] if floats else None
