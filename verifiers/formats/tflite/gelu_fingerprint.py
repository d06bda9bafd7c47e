"""Measure what each TFLite GELU site computes by running it alone on the catalogue's probes.

Each site's operators (same opcodes and versions, same builtin options, same constant buffers)
are written as a tiny .tflite from the site's input (shape [n]) to its output with the
flatbuffers object API of ai_edge_litert's schema module, and run in
ai_edge_litert.interpreter.Interpreter twice: with the plain builtin kernels
(BUILTIN_WITHOUT_DEFAULT_DELEGATES), which decide the flavour, and with the default XNNPACK
delegate, recorded alongside. XNNPACK's GELU returns 0 below x = -6 and has >1e-3 relative
error in [-5.07, -3.68]; those are absolute errors of at most ~1e-7, so absolute-error
classification holds for both.

A site whose input and output are per-tensor int8 (or uint8) is run on all 256 input codes and
its output codes compared with the table each catalogued flavour gives at its scales
(`verifiers.gelu.int8`); what the int8 resolution can tell apart is the verdict's question. Sites
of other types (int16 quantized, float16, mixed) are not confident: the probes cannot separate
exact from tanh there, so `measured_flavour` falls back to the structure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verifiers.runtimes import Runner, runtime_for
from verifiers.runtimes.isolation import counted
from verifiers.tflite_model import TFLiteModel, as_model, pack, schema

from verifiers.gelu.catalogue import UNKNOWN, Site
from verifiers.gelu.classification import FLOAT32_TOLERANCE, Classification, classify, probe_inputs
from verifiers.gelu.int8 import RANGES, Int8Grid, classify_table
from verifiers.formats.tflite.gelu_sites import SUBGRAPH, TFLiteGraph, read_graph

FLOAT32 = 0  # TensorType


@dataclass(frozen=True)
class TFLiteFingerprint:
    """A site's measurement: plain builtin kernels (decisive) and the XNNPACK delegate."""

    site: Site
    dtype: str
    classification: Classification
    xnnpack: Classification | None = None
    int8: Int8Grid | None = None  # the site's 8-bit quantization, when it was measured as a table

    @property
    def measured(self) -> str:
        return self.classification.flavour


def probe_model(graph: TFLiteGraph, site: Site) -> bytes:
    """The site's operators as a .tflite from site.input (shape [n]) to site.output."""
    s = schema()
    model = graph.model
    sg = graph.subgraph
    ops = sorted(graph.op_index(label) for label in site.nodes)
    source_input = graph.tensor_index(site.input)
    source_output = graph.tensor_index(site.output)

    tensors: list = []
    buffers = [s.BufferT()]
    index: dict[int, int] = {}

    def tensor(t: int) -> int:
        if t in index:
            return index[t]
        src = sg.tensors[t]
        new = s.TensorT()
        new.name = src.name.encode()
        new.type = src.type
        new.buffer = 0
        constant = t != source_input and src.buffer and model.buffers[src.buffer][1]
        if constant:
            value = model.constant(SUBGRAPH, t)
            if value is None:  # data that does not fit the shape: the interpreter must not see it
                raise ValueError(f"constant tensor {src.name!r} has {model.buffers[src.buffer][1]} bytes "
                                 f"for shape {list(src.shape)}")
            new.shape = list(src.shape)
            buf = s.BufferT()
            buf.data = np.frombuffer(model.buffer_bytes(src.buffer), np.uint8)
            buffers.append(buf)
            new.buffer = len(buffers) - 1
        elif t == source_input or t in produced:
            new.shape, new.shapeSignature = [len(probe_inputs())], [-1]
        else:  # a side input that is not a constant: zeros, so the probe measures the activation
            new.shape = [1]
            buf = s.BufferT()
            buf.data = np.zeros(np.dtype(np.float32).itemsize, np.uint8)
            buffers.append(buf)
            new.buffer = len(buffers) - 1
        if src.quantized:
            q = s.QuantizationParametersT()
            q.scale, q.zeroPoint = [src.scale], [src.zero_point]
            new.quantization = q
        tensors.append(new)
        index[t] = len(tensors) - 1
        return index[t]

    produced = {t for i in ops for t in sg.operators[i].outputs}
    opcodes: list = []
    opcode_index: dict[int, int] = {}
    operators = []
    for i in ops:
        src = sg.operators[i]
        if src.opcode_index not in opcode_index:
            oc = model.opcodes[src.opcode_index]
            code = s.OperatorCodeT()
            code.builtinCode = oc.code
            code.deprecatedBuiltinCode = min(oc.code, s.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
            code.version = oc.version
            if oc.custom:
                code.customCode = oc.name.encode()
            opcodes.append(code)
            opcode_index[src.opcode_index] = len(opcodes) - 1
        op = s.OperatorT.InitFromObj(model.operator_reader(SUBGRAPH, i))
        op.opcodeIndex = opcode_index[src.opcode_index]
        op.inputs = [tensor(t) if t >= 0 else -1 for t in src.inputs]
        op.outputs = [tensor(t) for t in src.outputs]
        op.intermediates = None
        operators.append(op)

    subgraph = s.SubGraphT()
    subgraph.tensors = tensors
    subgraph.operators = operators
    subgraph.inputs = [tensor(source_input)]
    subgraph.outputs = [tensor(source_output)]
    subgraph.name = b"gelu_probe"
    out = s.ModelT()
    out.version = 3
    out.operatorCodes = opcodes
    out.subgraphs = [subgraph]
    out.buffers = buffers
    out.description = b"exportgate GELU probe"
    return pack(out)




def run_probe(content: bytes, x: np.ndarray, xnnpack: bool = False, runner: type[Runner] | None = None) -> np.ndarray:
    """Run a one-input probe model on x in `runner`'s runtime (the TFLite default when None) with
    the plain builtin kernels (or the XNNPACK default)."""
    return np.array((runner or runtime_for("tflite")).run_probe(content, x, "xnnpack" if xnnpack else "builtin"))


def int8_grid(graph: TFLiteGraph, site: Site) -> Int8Grid | None:
    """The site's 8-bit quantization when its input and output are both per-tensor int8 (or both uint8)."""
    tensor, out = (graph.subgraph.tensors[graph.tensor_index(name)] for name in (site.input, site.output))
    if tensor.dtype != out.dtype or tensor.dtype not in RANGES or not (tensor.quantized and out.quantized):
        return None
    return Int8Grid(out.dtype, out.scale, out.zero_point, tensor.scale, tensor.zero_point)


def fingerprint_table(graph: TFLiteGraph, site: Site, grid: Int8Grid,
                      runner: type[Runner] | None = None) -> TFLiteFingerprint:
    """Run an 8-bit site on every input code (the plain builtin kernels) and name the flavour whose table it holds."""
    try:
        codes = run_probe(probe_model(graph, site), grid.codes(), runner=runner).reshape(-1)
        result = classify_table(grid, codes)
    except Exception as exc:  # noqa: BLE001 - the interpreter raises RuntimeError/ValueError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        result = Classification(UNKNOWN, {}, False, f"{grid.dtype} probe did not run: {first}")
    return TFLiteFingerprint(site, grid.dtype, result, int8=grid)


def fingerprint_site(graph: TFLiteGraph, site: Site, runner: type[Runner] | None = None) -> TFLiteFingerprint:
    """Probe one site: float32 on the catalogue's probes, int8/uint8 on every input code (`fingerprint_table`);
    other input types come back not confident."""
    grid = int8_grid(graph, site)
    if grid is not None:
        return fingerprint_table(graph, site, grid, runner)
    tensor = graph.subgraph.tensors[graph.tensor_index(site.input)]
    if tensor.type != FLOAT32 or tensor.quantized:
        what = f"{tensor.dtype}{' quantized' if tensor.quantized else ''}"
        return TFLiteFingerprint(site, tensor.dtype, Classification(
            UNKNOWN, {}, False, f"{what} site: probes cannot separate exact from tanh"))
    x = probe_inputs(np.float32)
    try:
        content = probe_model(graph, site)
        y = run_probe(content, x, runner=runner).reshape(-1)
    except Exception as exc:  # noqa: BLE001 - the interpreter raises RuntimeError/ValueError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return TFLiteFingerprint(site, tensor.dtype, Classification(UNKNOWN, {}, False, f"probe did not run: {first}"))
    if y.size != x.size:
        return TFLiteFingerprint(site, tensor.dtype, Classification(
            UNKNOWN, {}, False, f"probe gave {y.size} outputs for {x.size} inputs"))
    result = classify(x, y, FLOAT32_TOLERANCE)
    try:
        xnn = classify(x, run_probe(content, x, xnnpack=True, runner=runner).reshape(-1), FLOAT32_TOLERANCE)
    except Exception as exc:  # noqa: BLE001
        xnn = Classification(UNKNOWN, {}, False, f"XNNPACK probe did not run: {exc}")
    if xnn.flavour != result.flavour:
        result = Classification(result.flavour, result.residuals, result.confident,
                                f"{result.note}; with XNNPACK: {xnn.flavour} ({xnn.note})")
    return TFLiteFingerprint(site, tensor.dtype, result, xnn)


def fingerprint_sites(model: TFLiteModel | TFLiteGraph | str | Path, sites: list[Site],
                      runner: type[Runner] | None = None) -> list[TFLiteFingerprint]:
    graph = model if isinstance(model, TFLiteGraph) else read_graph(as_model(model))
    return [fingerprint_site(graph, s, runner) for s in counted(sites)]
