"""Where an integer (int8) artifact loses its accuracy: SQNR of every quantized tensor against the
float model's tensor of the same name, and the first layer in graph order that collapses.

The errors accumulate along the graph, so the tensors after a ruined layer inherit its error;
`first_collapse` names the earliest tensor below the threshold (graph order), which is where the
loss starts. Formats are found in LAYER_DIAGNOSERS by format name. Both models run through the
artifact's runtime (`Runner.run_inspection`: as written, no graph rewrite, no delegate), and
the whole diagnosis runs in that runtime's worker (exporter.checks.quantization), like every other run:

- ONNX (as onnxruntime.quantization.qdq_loss_debug does): every
  DequantizeLinear output of the QDQ model, activations and weights, becomes an extra graph
  output, and so does the float model's tensor it stands for; both run without graph rewrites,
  so the QDQ model computes what its Q/DQ nodes say. A DequantizeLinear output stands for the
  first of these names the float model has: its own output, the input of the QuantizeLinear
  feeding it, its own input, then each of those with onnxruntime's suffixes taken off
  (`_QuantizeLinear_Input`, `_DequantizeLinear_Output`, `_quantized`). Without a float model,
  `float_from_qdq` rebuilds one from the QDQ model (Q/DQ pairs on activations removed, weights
  dequantized): weight rounding is then not seen, only activation rounding.
- TFLite: both models keep every tensor; every int8/uint8/int16 tensor, and every int32 tensor with
  quantization parameters (biases), is dequantized with its scale(s) and zero point(s) and
  matched by name with the float model's tensor. The converter mostly keeps names; a quantized
  tensor whose name the float model does not have, or has with another shape (a deduplicated
  constant, the QUANTIZE op's output of a float-input model), is not compared, and the summary
  counts it. Float inputs are quantized with the int8 model's input quantization when its inputs
  are integer.

Graph order (`LayerError.order`) is the position of a tensor in a walk of the quantized model's
operators in their stored (topological) order: each operator's inputs not yet seen, then its
outputs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verifiers.errors import BadInput
from verifiers.naming import shown
from verifiers.quantization.metrics import dequantize, quantize, sqnr_db


@dataclass(frozen=True)
class LayerError:
    tensor: str  # the float model's name of the tensor
    op_type: str  # the float model's op producing it ("input", "initializer"/"constant" for the rest)
    sqnr_db: float
    order: int  # graph order: smaller runs earlier


def first_collapse(layers: list[LayerError], min_sqnr_db: float) -> LayerError | None:
    """The earliest tensor in graph order whose SQNR is below min_sqnr_db (None: every one reaches it)."""
    below = [layer for layer in layers if not layer.sqnr_db >= min_sqnr_db]
    return min(below, key=lambda layer: layer.order) if below else None


@dataclass(frozen=True)
class LayerDiagnosis:
    layers: list[LayerError]  # worst first
    unmatched: int  # quantized tensors not compared (no float tensor of that name and shape)
    weights_seen: bool = True  # False: the float reference was rebuilt from the QDQ model

    def summary(self, min_sqnr_db: float) -> str:
        """One line: how many tensors were compared, the first collapse and the worst tensor."""
        if not self.layers:
            text = "no quantized tensor matched a float tensor by name"
        else:
            worst = self.layers[0]
            collapse = first_collapse(self.layers, min_sqnr_db)
            text = f"{len(self.layers)} quantized tensor(s) compared; "
            if collapse is None:
                text += f"all reach {min_sqnr_db:g} dB (lowest {_named(worst)})"
            else:
                text += f"first below {min_sqnr_db:g} dB: {_named(collapse)}; worst {_named(worst)}"
        if self.unmatched:
            text += f"; {self.unmatched} quantized tensor(s) have no float tensor of the same name and shape"
        if not self.weights_seen:
            text += "; float reference rebuilt from the QDQ model: weight rounding is not seen"
        return text


def _named(layer: LayerError) -> str:
    return f"{shown(layer.tensor)} ({layer.op_type}) {layer.sqnr_db:.1f} dB"


def _ranked(layers: list[LayerError]) -> list[LayerError]:
    return sorted(layers, key=lambda layer: (layer.sqnr_db, layer.order))


# ---- ONNX ----------------------------------------------------------------------------------------

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
    return LayerDiagnosis(_ranked(layers), unmatched, weights_seen=float_path is not None)


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

_INTEGER_TYPES = ("int8", "uint8", "int16")


def _graph_order(subgraph) -> dict[int, int]:
    """Tensor index -> position in the walk of the operators: inputs not yet seen, then outputs."""
    order: dict[int, int] = {}
    for index in subgraph.inputs:
        order.setdefault(index, len(order))
    for op in subgraph.operators:
        for index in (*op.inputs, *op.outputs):
            if index >= 0:
                order.setdefault(index, len(order))
    return order


def _input_tensors(model) -> list[tuple[str, int]]:
    """(feed name, tensor index) of subgraph 0's inputs: the signature's names when it has one
    (serving_default, else the first key in order), the tensor names otherwise."""
    signatures = sorted((sd for sd in model.signatures if sd.subgraph == 0),
                        key=lambda sd: (sd.key != "serving_default", sd.key))
    if signatures:
        return list(signatures[0].inputs)
    subgraph = model.subgraphs[0]
    return [(subgraph.tensors[i].name, i) for i in subgraph.inputs if i >= 0]


def _run_keeping_tensors(runner_class, path: Path, model, feeds: list[dict[str, np.ndarray]], wanted: list[int]
                         ) -> dict[int, list[np.ndarray]]:
    """Every `wanted` tensor's value after each feed, run by the runtime as written; integer
    inputs get float feeds quantized."""
    content = path.read_bytes()
    tensors = model.subgraphs[0].tensors
    inputs = _input_tensors(model)
    keep = [str(index) for index in wanted]
    values: dict[int, list[np.ndarray]] = {index: [] for index in wanted}
    for feed in feeds:
        by_index = {}
        for position, (name, index) in enumerate(inputs):
            value = feed[name] if name in feed else list(feed.values())[position]
            tensor = tensors[index]
            if tensor.dtype in _INTEGER_TYPES and np.asarray(value).dtype.kind == "f":
                value = quantize(value, tensor.scale, tensor.zero_point, np.dtype(tensor.dtype))
            by_index[str(index)] = np.asarray(value)
        results = runner_class.run_inspection(content, by_index, keep)
        for index in wanted:
            values[index].append(results[str(index)])
    return values


def _real(tensor, value: np.ndarray) -> np.ndarray:
    axis = tensor.quantized_dimension if len(tensor.scales) > 1 else None
    return dequantize(value, tensor.scales, tensor.zero_points, axis)


_BOUNDARY_OPS = ("QUANTIZE", "DEQUANTIZE")  # what quantizing adds to a graph, or keeps of a float one


def _positional_pairs(q_model, q_graph, f_model, f_graph) -> dict[int, int]:
    """Quantized tensor -> float tensor by place, for models whose tensor names differ (another
    converter's, or another tracing's): the model inputs in order, and the k-th operator of each
    kind in both graphs (QUANTIZE and DEQUANTIZE left out), input slot by input slot and output by
    output. Kinds whose counts differ are not paired."""
    def by_kind(model, graph) -> dict[str, list]:
        kinds: dict[str, list] = {}
        for op in graph.operators:
            name = model.opcode(op).name
            if name not in _BOUNDARY_OPS:
                kinds.setdefault(name, []).append(op)
        return kinds

    pairs = dict(zip(q_graph.inputs, f_graph.inputs))
    q_ops, f_ops = by_kind(q_model, q_graph), by_kind(f_model, f_graph)
    for kind, ops in q_ops.items():
        if len(ops) != len(f_ops.get(kind, ())):
            continue
        for q_op, f_op in zip(ops, f_ops[kind]):
            for q, f in zip((*q_op.inputs, *q_op.outputs), (*f_op.inputs, *f_op.outputs)):
                if q >= 0 and f >= 0:
                    pairs.setdefault(q, f)
    return pairs


def tflite_layer_errors(quantized_path: Path, float_path: Path | None, feeds: list[dict[str, np.ndarray]],
                        runner_class) -> LayerDiagnosis:
    from verifiers.tflite_model import load_tflite

    if float_path is None:
        raise BadInput(f"{quantized_path}: per-layer diagnosis of a TFLite model needs its float model")
    quantized, reference = load_tflite(quantized_path), load_tflite(float_path)
    q_graph, f_graph = quantized.subgraphs[0], reference.subgraphs[0]
    float_index = {t.name: i for i, t in enumerate(f_graph.tensors)}
    float_kind = {i: "constant" for i, t in enumerate(f_graph.tensors) if t.buffer > 0}
    float_kind.update({i: "input" for i in f_graph.inputs})
    float_kind.update({out: reference.opcode(op).name for op in f_graph.operators for out in op.outputs})
    order = _graph_order(q_graph)
    by_position = _positional_pairs(quantized, q_graph, reference, f_graph)
    pairs: list[tuple[int, int]] = []  # (quantized tensor, float tensor)
    unmatched = 0
    for index in order:
        tensor = q_graph.tensors[index]
        if not tensor.scales or not (tensor.dtype in _INTEGER_TYPES or tensor.dtype == "int32"):
            continue
        candidates = (float_index.get(tensor.name), by_position.get(index))
        match = next((c for c in candidates if c is not None and f_graph.tensors[c].shape == tensor.shape), None)
        if match is None:
            unmatched += 1
        else:
            pairs.append((index, match))
    quantized_values = _run_keeping_tensors(runner_class, quantized_path, quantized, feeds, [q for q, _ in pairs])
    # several quantized tensors may stand for one float tensor (a model input and its QUANTIZE)
    float_values = _run_keeping_tensors(runner_class, float_path, reference, feeds,
                                        list(dict.fromkeys(f for _, f in pairs)))
    layers = []
    for q, f in pairs:
        tensor = q_graph.tensors[q]
        arts = [_real(tensor, value) for value in quantized_values[q]]
        layers.append(LayerError(tensor.name, float_kind.get(f, "tensor"), sqnr_db(float_values[f], arts), order[q]))
    return LayerDiagnosis(_ranked(layers), unmatched)


# ---- by format -----------------------------------------------------------------------------------

LayerDiagnoser = Callable[[Path, Path | None, list[dict[str, np.ndarray]], type], LayerDiagnosis]
LAYER_DIAGNOSERS: dict[str, LayerDiagnoser] = {"onnx": onnx_layer_errors, "tflite": tflite_layer_errors}


def diagnose_layers(quantized_path: str | Path, float_path: str | Path | None,
                    feeds: list[dict[str, np.ndarray]], format: str | None = None,
                    runner_class: type | None = None) -> LayerDiagnosis:
    """Per-tensor SQNR of a quantized model against its float model (`format`: a LAYER_DIAGNOSERS
    key, by default the file's format as verifiers.formats detects it), both run by `runner_class`
    (verifiers.runtimes; by default the format's runtime); float_path None is allowed for ONNX
    (float_from_qdq)."""
    quantized_path = Path(quantized_path)
    if format is None:
        from verifiers.formats import detect_format

        format = detect_format(quantized_path).name
    diagnoser = LAYER_DIAGNOSERS.get(format)
    if diagnoser is None:
        raise BadInput(f"{quantized_path}: no per-layer diagnosis for format {format!r} "
                       f"(known: {', '.join(sorted(LAYER_DIAGNOSERS))})")
    if not feeds:
        raise BadInput(f"{quantized_path}: per-layer diagnosis needs at least one feed")
    if runner_class is None:
        from verifiers.runtimes import runtime_for

        runner_class = runtime_for(format)
    return diagnoser(quantized_path, None if float_path is None else Path(float_path), feeds, runner_class)


def layer_errors(quantized_path: str | Path, float_path: str | Path | None, feeds: list[dict[str, np.ndarray]],
                 format: str | None = None) -> list[LayerError]:
    """diagnose_layers' tensors, worst first."""
    return diagnose_layers(quantized_path, float_path, feeds, format).layers
