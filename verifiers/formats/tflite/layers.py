"""An int8 TFLite model's layers against its float model (verifiers.quantization.layers says how they
are judged): both keep every tensor; every quantized tensor is dequantized and matched by name
(or position) with the float model's tensor of the same shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from verifiers.errors import BadInput
from verifiers.quantization.layers import LayerDiagnosis, LayerError, ranked
from verifiers.quantization.metrics import dequantize, quantize, sqnr_db

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
    return LayerDiagnosis(ranked(layers), unmatched)
