"""--quantize fp16 for both ONNX routes: the float32 export, its values measured, then onnxruntime's
float16 converter (onnxruntime.transformers.float16) with the ops that must stay float32 kept.

Which ops stay float32:
- the converter's own block list (ops without float16 kernels), and the normalisations, Softmax and
  reductions onnxruntime's transformer tools keep in float32 for float16 models (KEPT_OP_TYPES);
- measured: the float32 export runs op by op on the measurement batches (the calibration data, else
  --data, else seeded batches) in onnxruntime's worker (verifiers.float16_ranges), and an op whose
  read or written values reach within RANGE_MARGIN of float16's largest (65504), or whose nonzero
  activations fall below float16's smallest normal (6.1e-5) in more than TINY_FRACTION of cases,
  stays float32; every other op computes in float16 (keeping everything would be no float16 model);
- --keep-fp32: an op type (`Softmax`), or a module whose ops it names (`encoder.layer.0`, `fc1`);
- with any op kept, the rest of the GELU it is part of: a GELU computes in one precision, so the
  guard reads its flavour by structure (float16 outputs cannot tell exact from tanh).

The conversion is onnxruntime's OnnxModel.convert_float_to_float16, which also removes the float16
round trips the converter puts between two ops kept float32 (a value beyond float16's range would
become Inf there). The graph's inputs and outputs stay float32 (--io float16 makes them float16).
The converter writes the casts of graph inputs after the nodes that read them; the artifact's
nodes are put in order again (onnx.checker requires it). The report's quantization says which ops
were kept and why.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from exporter.routes import ExportRequest, ExportResult
from exporter.staging import remove_artifact
from verifiers.errors import BadInput, one_line
from verifiers.float16_ranges import FLOAT16_MAX, FLOAT16_SMALLEST_NORMAL, OpRange
from verifiers.quiet import quiet_exporter

# What onnxruntime's transformer tools keep in float32 for float16 models (models/gpt2/gpt2_parity.py,
# models/t5/t5_helper.py, convert_generation.py: LayerNormalization, SkipLayerNormalization,
# SimplifiedLayerNormalization), with the other normalisations, Softmax and the reductions of squares.
KEPT_OP_TYPES = ("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                 "SkipSimplifiedLayerNormalization", "GroupNormalization", "InstanceNormalization",
                 "Softmax", "LogSoftmax", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp")
RANGE_MARGIN = 4.0  # an op whose values reach 65504 / 4 stays float32: data beyond the measured reaches further
TINY_FRACTION = 0.05  # an op reading more than this share of its nonzero values as float16 subnormals stays float32


def kept_float32(ranges: list[OpRange], keep: list[str]) -> list[dict]:
    """The ops that stay float32 and why, in graph order."""
    limit = FLOAT16_MAX / RANGE_MARGIN
    kept = []
    for op in ranges:
        why = None
        named = next((k for k in keep if k == op.op_type or _in_module(op.scope, k)), None)
        if named is not None:
            why = f"--keep-fp32 {named}"
        elif op.op_type in KEPT_OP_TYPES:
            why = "kept float32 by onnxruntime's float16 tools"
        elif op.reach >= limit:
            why = (f"measured max |value| {op.reach:.3g}, within {RANGE_MARGIN:g}x of float16's largest "
                   f"{FLOAT16_MAX:g}")
        elif op.tiny_fraction > TINY_FRACTION:
            why = (f"measured {op.tiny_fraction:.0%} of its nonzero inputs below float16's smallest normal "
                   f"{FLOAT16_SMALLEST_NORMAL:.2g}")
        if why is not None:
            kept.append({"node": op.node, "op_type": op.op_type, "why": why, "max_abs": op.reach})
    return kept


def with_whole_gelus(kept: list[dict], model) -> list[dict]:
    """The kept ops, and with each the rest of any GELU (or SiLU) it is part of: a GELU computes in
    one precision, so its flavour stays one the guard can read by structure (a chain split between
    float16 and float32 reads as none)."""
    from verifiers.formats.onnx.gelu_sites import find_activation_sites, searchable
    from verifiers.gelu.catalogue import RELU

    named = {entry["node"] for entry in kept}
    ops = {node.name: node.op_type for node in model.graph.node}
    added = []
    for site in find_activation_sites(searchable(model)):
        inside = [node for node in site.nodes if node in named]
        if site.claimed == RELU or not inside:
            continue
        for node in site.nodes:
            if node not in named and node in ops:
                named.add(node)
                added.append({"node": node, "op_type": ops[node], "why": f"part of the {site.op} at {site.site_id} "
                                                                           f"with {inside[0]}, kept float32",
                              "max_abs": None})
    order = {name: k for k, name in enumerate(ops)}
    return sorted([*kept, *added], key=lambda entry: order.get(entry["node"], len(order)))


def _constants_of(nodes: list[str], model) -> list[str]:
    """The Constant nodes only `nodes` read: kept float32 with them (else the converter rounds a
    GELU's 1/sqrt(2) or 0.044715 to float16 and casts it back, and the flavour it computes moves)."""
    kept = set(nodes)
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.name)
    return [node.name for node in model.graph.node if node.op_type == "Constant" and node.name
            and all(readers.get(output) and readers[output] <= kept for output in node.output)]


def _in_module(scope: str, module: str) -> bool:
    """Whether a module path (`encoder.layer.0`) holds `module`, given as a path or its tail."""
    parts, wanted = scope.split("."), module.replace("/", ".").split(".")
    return bool(scope) and any(parts[k:k + len(wanted)] == wanted for k in range(len(parts) - len(wanted) + 1))


def export_fp16(export_float: Callable[[Path], ExportResult], request: ExportRequest, dest: Path, progress
                ) -> ExportResult:
    """`export_float(path)` writes the float32 model at `path`; it runs op by op in onnxruntime's
    worker, and the float16 model is written at `dest` (see the module's docstring)."""
    dest = Path(dest)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}.float-", dir=dest.parent) as folder:
        float_path = Path(folder).resolve() / dest.name
        result = export_float(float_path)
        progress(f"measuring the float32 model's values op by op on {len(request.calibration)} batch(es)")
        ranges = _measured(float_path, request.calibration)
        try:
            kept = _convert(float_path, dest, request, ranges, progress)
        except BaseException:
            remove_artifact(dest, "onnx")
            raise
    counted = len({op.node for op in ranges if op.op_type != "Constant"})  # the ops that compute
    result.quantization = {"mode": "fp16", "io": request.io, "method": _method(), "kept_float32": kept,
                           "ops": counted}
    return result


def _convert(float_path: Path, dest: Path, request: ExportRequest, ranges: list[OpRange], progress) -> list[dict]:
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST
    from onnxruntime.transformers.onnx_model import OnnxModel

    from verifiers.onnx_float16 import sorted_nodes

    model = onnx.load(str(float_path))
    unknown = [k for k in request.keep_fp32 if not any(k == op.op_type or _in_module(op.scope, k) for op in ranges)]
    if unknown:
        raise BadInput(f"--keep-fp32 {unknown[0]}: no op of that type or in that module in the exported model "
                       "(give an ONNX op type such as Softmax, or a module path such as encoder.layer.0)",
                       option="keep_fp32")
    kept = with_whole_gelus(kept_float32(ranges, request.keep_fp32), model)
    progress(f"converting to float16 ({_method()}), {len(kept)} op(s) kept float32")
    try:
        with quiet_exporter():
            converter = OnnxModel(model)  # its conversion removes the cast pairs between two float32 ops
            converter.convert_float_to_float16(
                keep_io_types=request.io != "float16", op_block_list=[*DEFAULT_OP_BLOCK_LIST, *KEPT_OP_TYPES],
                node_block_list=[entry["node"] for entry in kept] + _constants_of([e["node"] for e in kept], model))
            converted = converter.model
    except Exception as exc:  # noqa: BLE001 - the converter's own refusal, in one line
        raise BadInput(f"--quantize fp16: {_method()} failed: {one_line(exc)}") from exc
    ordered = sorted_nodes(converted.graph)
    del converted.graph.node[:]
    converted.graph.node.extend(ordered)
    onnx.save(converted, str(dest))
    return kept


def _measured(path: Path, feeds: list[dict]) -> list[OpRange]:
    """verifiers.float16_ranges.measure of the ONNX model at `path`, in onnxruntime's worker; the
    feeds (by the source's input names) go to the model's inputs in order."""
    import onnx

    from verifiers.float16_ranges import measure
    from verifiers.formats import artifact_format
    from verifiers.runtimes import isolation, runtime_for

    graph = onnx.load(str(path), load_external_data=False).graph
    initialized = {tensor.name for tensor in graph.initializer}
    names = [value.name for value in graph.input if value.name not in initialized]
    named = [dict(zip(names, feed.values())) for feed in feeds]
    runner_class = runtime_for("onnx")
    return isolation.call(measure, artifact_format("onnx"), path, named, runner_class, runtime=runner_class.runtime,
                          step="measuring the float32 model's values op by op")


def _method() -> str:
    import onnxruntime

    return f"onnxruntime.transformers {onnxruntime.__version__} OnnxModel.convert_float_to_float16"
