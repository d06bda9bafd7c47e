"""An int8 ONNX model's layers against its float model (verifiers.quantization.layers says how they
are judged): every DequantizeLinear output of the QDQ model, activations and weights, becomes an
extra graph output, and so does the float model's tensor it stands for (as
onnxruntime.quantization.qdq_loss_debug does); both run without graph rewrites. Without a float
model, `float_from_qdq` rebuilds one from the QDQ model."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from verifiers.quantization.layers import LayerDiagnosis, LayerError, ranked
from verifiers.quantization.metrics import dequantize, sqnr_db

_ORT_SUFFIX = re.compile(r"(_QuantizeLinear_Input|_QuantizeLinear_Output|_DequantizeLinear_Output(_\d+)?|_quantized)$")


def _producers(graph) -> dict[str, object]:
    return {output: node for node in graph.node for output in node.output}


def _float_names(qdq_graph) -> list[tuple[int, str, list[str]]]:
    """(node index, DequantizeLinear output, candidate float names in order of preference)."""
    producers = _producers(qdq_graph)
    found = []
    for index, node in enumerate(qdq_graph.node):
        if node.op_type != "DequantizeLinear":
            continue
        source = producers.get(node.input[0])
        names = [node.output[0]]
        names += [source.input[0]] if source is not None and source.op_type == "QuantizeLinear" else []
        names += [node.input[0]]
        names += [_ORT_SUFFIX.sub("", name) for name in names]
        found.append((index, node.output[0], names))
    return found


def _float_tensors(graph) -> dict[str, str]:
    """Every tensor of a float ONNX graph -> what produces it (op type, "input" or "initializer")."""
    kinds = {init.name: "initializer" for init in graph.initializer}
    kinds.update({value.name: "input" for value in graph.input if value.name not in kinds})
    for node in graph.node:  # in topological order: an Identity reads as what produces its input
        kind = kinds.get(node.input[0], "input") if node.op_type == "Identity" else node.op_type
        kinds.update({output: kind for output in node.output if output})
    return kinds


def _run_with_outputs(runner_class, model, names: list[str], feeds: list[dict[str, np.ndarray]]
                      ) -> dict[str, list[np.ndarray]]:
    """`model` with `names` added as graph outputs, run by the runtime as written on every feed."""
    import onnx

    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    present = {output.name for output in augmented.graph.output}
    augmented.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names if name not in present)
    content = augmented.SerializeToString()
    values: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for feed in feeds:
        results = runner_class.run_inspection(content, feed, names)
        for name in names:
            values[name].append(np.asarray(results[name]))
    return values


def onnx_layer_errors(quantized_path: Path, float_path: Path | None, feeds: list[dict[str, np.ndarray]],
                      runner_class) -> LayerDiagnosis:
    import onnx

    qdq = onnx.load(str(quantized_path))
    reference = onnx.load(str(float_path)) if float_path is not None else float_from_qdq(qdq)
    kinds = _float_tensors(reference.graph)
    matched: dict[str, tuple[int, str]] = {}  # float name -> (order, DequantizeLinear output)
    unmatched = 0
    for order, output, candidates in _float_names(qdq.graph):
        name = next((candidate for candidate in candidates if candidate in kinds), None)
        if name is None:
            unmatched += 1
        elif name not in matched and (float_path is not None or kinds[name] != "initializer"):
            # (a rebuilt model's weights are the quantized ones: nothing to compare)
            matched[name] = (order, output)
    quantized_values = _run_with_outputs(runner_class, qdq, [output for _, output in matched.values()], feeds)
    float_values = _run_with_outputs(runner_class, reference, list(matched), feeds)
    layers = []
    for name, (order, output) in matched.items():
        refs, arts = float_values[name], quantized_values[output]
        if [r.shape for r in refs] != [a.shape for a in arts]:
            unmatched += 1
            continue
        layers.append(LayerError(name, kinds[name], sqnr_db(refs, arts), order))
    return LayerDiagnosis(ranked(layers), unmatched, weights_seen=float_path is not None)


def float_from_qdq(model):
    """A float onnx.ModelProto from a QDQ one, its tensors keeping their names: every
    QuantizeLinear -> DequantizeLinear pair on an activation becomes an Identity, or a Relu when
    its range starts at 0 (zero point at the integer type's minimum: a ReLU the quantizer folded
    into the pair), and every DequantizeLinear of an initializer becomes the dequantized float
    initializer. The weights are the quantized ones, so a comparison with it shows activation
    rounding only; a clipping pair (a scale too small) clips in the QDQ model alone and is seen."""
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    producers = _producers(graph)
    nodes, weights = [], []
    for node in graph.node:
        source = producers.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if source is not None and source.op_type == "QuantizeLinear":
            op_type = "Relu" if _range_starts_at_zero(source, initializers) else "Identity"
            nodes.append(onnx.helper.make_node(op_type, [source.input[0]], [node.output[0]]))
        elif node.op_type == "DequantizeLinear" and node.input[0] in initializers:
            weights.append(numpy_helper.from_array(_dequantized_initializer(node, initializers), node.output[0]))
        else:
            nodes.append(node)
    consumed = {name for node in nodes for name in node.input} | {output.name for output in graph.output}
    nodes = [node for node in nodes if node.op_type != "QuantizeLinear" or set(node.output) & consumed]
    used = {name for node in nodes for name in node.input}
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(nodes)
    del result.graph.initializer[:]
    result.graph.initializer.extend([init for init in graph.initializer if init.name in used] + weights)
    return result


def _range_starts_at_zero(quantize_node, initializers) -> bool:
    """A QuantizeLinear whose zero point is its integer type's minimum (uint8 by default: 0)."""
    from onnx import numpy_helper

    if len(quantize_node.input) < 3 or quantize_node.input[2] not in initializers:
        return True  # no zero point: uint8 with zero point 0
    zero_point = numpy_helper.to_array(initializers[quantize_node.input[2]])
    return zero_point.dtype.kind in "iu" and bool(np.all(zero_point == np.iinfo(zero_point.dtype).min))


def _dequantized_initializer(node, initializers) -> np.ndarray:
    from onnx import numpy_helper

    def value(index):
        if len(node.input) <= index or not node.input[index]:
            return None
        return numpy_helper.to_array(initializers[node.input[index]])

    q, scale, zero_point = value(0), value(1), value(2)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1) if scale.size > 1 else None
    if axis is not None and axis < 0:
        axis += q.ndim
    real = dequantize(q, scale, 0 if zero_point is None else zero_point, axis)
    return real.astype(scale.dtype)


# ---- TFLite --------------------------------------------------------------------------------------
