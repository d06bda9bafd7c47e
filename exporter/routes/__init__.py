"""Export routes, one per (framework, format), found through a lazy registry (a route's module is
imported only when a command exports along it or asks what it accepts).

A route takes a Source and an ExportRequest, writes the artifact at the path it is given (plus any
external data beside it) and returns what it did. Exporter quirks stay inside the route that has them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from verifiers.errors import BadInput, Incompatible
from verifiers.naming import shown
from verifiers.registry import LazyRegistry
from exporter.sources import Source
from verifiers.sizes import DynamicAxis

Progress = Callable[[str], None]
IO_TYPES = ("float", "int8", "uint8", "float16")
# Ops that only convert between float and int8 around an op left float.
CONVERSION_OPS = frozenset({"QUANTIZE", "DEQUANTIZE", "QuantizeLinear", "DequantizeLinear"})


@dataclass
class ExportRequest:
    format: str
    opset: int | None = None
    exporter: str = "auto"
    dynamic: list[DynamicAxis] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)  # the source's, given to the artifact
    sample_inputs: dict = field(default_factory=dict)  # one input batch, for tracing
    # None; "int8" (full-integer, calibrated: every route); "fp16" (ONNX: float16 compute, measured
    # ops kept float32; TFLite: float16 weights); TFLite only: "dynamic-int8" (dynamic range)
    quantize: str | None = None
    io: str = "float"  # --quantize int8 or fp16: the artifact's input/output types where the route allows (IO_TYPES)
    # --quantize int8: the feeds to calibrate on; fp16: to measure the values on; keyed by the
    # source's input names, already checked (exporter.feed_files.load_calibration, or seeded random batches)
    calibration: list[dict[str, np.ndarray]] = field(default_factory=list)
    keep_fp32: list[str] = field(default_factory=list)  # --quantize fp16: op types and modules kept float32
    allow_float: bool = False  # --quantize int8: ops that cannot be quantized may stay float


@dataclass
class ExportResult:
    exporter: str  # what produced the artifact, e.g. "torch.onnx (dynamo)"
    notes: list[str] = field(default_factory=list)
    # Why a dynamic axis may not hold at other sizes, seen while exporting (report.dynamic_hints).
    hints: list[dict] = field(default_factory=list)
    # --quantize int8: {"mode": "int8", "io": ..., "method": what quantized, with versions,
    # "float_fallback": whether ops were left float (--allow-float-ops)}
    quantization: dict | None = None


def check_io(io: str, quantize: str | None) -> None:
    """--io is one of IO_TYPES: int8 and uint8 only with --quantize int8, float16 only with fp16."""
    if io not in IO_TYPES:
        raise BadInput(f"--io {io!r}: choose one of {', '.join(IO_TYPES)}", option="io")
    if io == "float16" and quantize != "fp16":
        raise BadInput("--io float16 sets the input/output types of float16 exports only: add --quantize fp16",
                       option="io")
    if io in ("int8", "uint8") and quantize != "int8":
        raise BadInput(f"--io {io} sets the input/output types of full-integer exports only: add --quantize int8",
                       option="io")


def check_int8_request(request: ExportRequest) -> None:
    """The full-integer options a route reads: --io only with --quantize int8, calibration data for it."""
    check_io(request.io, request.quantize)
    if request.quantize == "int8" and not request.calibration:
        raise BadInput("--quantize int8 needs calibration data, and the calibration set is empty")


def float_compute_ops(artifact: Path, fmt: str) -> list:
    """The ops of a quantized artifact that compute in float (verifiers.precision), without those
    that only convert around them; all float ops when they only convert."""
    from verifiers.formats import FORMATS

    float_ops = list(FORMATS[fmt].open(Path(artifact)).precision().float_ops)
    return [op for op in float_ops if op.op_type not in CONVERSION_OPS] or float_ops


def int8_result(request: ExportRequest, method: str, artifact: Path, fmt: str) -> dict:
    """ExportResult.quantization of the full-integer export written at `artifact`. Ops it left
    float (verifiers.precision) fail the export, the artifact removed, unless the request allows
    them (float_fallback)."""
    from exporter.staging import remove_artifact

    compute = float_compute_ops(artifact, fmt)
    if compute and not request.allow_float:
        remove_artifact(Path(artifact), fmt)
        first = compute[0]
        raise Incompatible(f"--quantize int8: no int8 form for {', '.join(sorted({op.op_type for op in compute}))} "
                           f"(first: {shown(first.node)} on {first.dtype} tensor {shown(first.tensor)}); "
                           "--allow-float-ops keeps such ops float")
    return {"mode": "int8", "io": request.io, "method": method, "float_fallback": bool(compute)}


class Route:
    framework: str
    format: str
    exporters: tuple[str, ...]  # values --exporter accepts besides "auto"
    quantize_modes: tuple[str, ...] = ()  # values --quantize accepts
    static_shapes: bool = False  # exports at fixed sizes only (a --dynamic axis is refused)
    calls: tuple[str, ...] = ()  # a WITH_PAST route: the model_tasks calls with past it exports
    opsets_written_by: str = ""  # what bounds `opsets()`, as an --opset refusal says it

    def opsets(self) -> tuple[int, int] | None:
        """The lowest and highest default-domain opset the route writes (None: its format has none)."""
        return None

    def export(self, source: Source, request: ExportRequest, dest: Path, progress: Progress) -> ExportResult:
        raise NotImplementedError


ROUTES: LazyRegistry[Route] = LazyRegistry("route", {
    "torch->onnx": "exporter.routes.torch_onnx:TorchToOnnx",
    "keras->onnx": "exporter.routes.keras_onnx:KerasToOnnx",
    "keras->tflite": "exporter.routes.keras_tflite:KerasToTflite",
    "torch->tflite": "exporter.routes.torch_tflite:TorchToTflite",
}, instantiate=True)


# For a task with past (a decoder's KV cache grows from an empty prefill one step at a time) where
# the format's route exports fixed sizes: the route that writes the format's LLM form instead.
WITH_PAST: LazyRegistry[Route] = LazyRegistry("route", {
    "torch->tflite": "exporter.routes.litert_lm:TorchToLiteRtLm",
}, instantiate=True)


def _key(framework: str, fmt: str) -> str:
    return f"{framework}->{fmt}"


def formats() -> list[str]:
    return sorted({key.partition("->")[2] for key in ROUTES})


def check_request(fmt: str, exporter: str = "auto", quantize: str | None = None) -> None:
    """What can be checked of --to, --exporter and --quantize before the model (and so its
    framework) is known: each must be an option of some route to `fmt`."""
    routes = [ROUTES[key] for key in ROUTES if key.partition("->")[2] == fmt]
    if not routes:
        raise BadInput(f"--to {fmt!r}: choose one of {', '.join(formats())}", option="to")
    exporters = sorted({name for route in routes for name in route.exporters})
    if exporter != "auto" and exporter not in exporters:
        raise BadInput(f"--exporter {exporter!r} does not export to {fmt} (choose auto or one of "
                       f"{', '.join(exporters)})", option="exporter")
    modes = sorted({mode for route in routes for mode in route.quantize_modes})
    if quantize is not None and quantize not in modes:
        choice = f"choose one of {', '.join(modes)}" if modes else "it has none"
        raise BadInput(f"--quantize {quantize!r} is not an option of {fmt} exports ({choice})", option="quantize")


def check_opset(fmt: str, opset: int | None, framework: str | None = None) -> None:
    """--opset against the opsets the routes to `fmt` write (those of `framework` when it is known),
    before anything loads: BadInput for a format without opsets, Incompatible (exit 4) naming each
    route's range for one no route writes."""
    if opset is None:
        return
    if opset < 1:
        raise BadInput(f"--opset {opset}: must be a positive opset number")
    routes = [ROUTES[key] for key in ROUTES if key.partition("->")[2] == fmt
              and (framework is None or key.partition("->")[0] == framework)]
    ranges = [(route, route.opsets()) for route in routes]
    if all(span is None for _, span in ranges):
        raise BadInput(f"--opset {opset}: opsets are ONNX's; {fmt} has none (leave --opset out)")
    if any(span is not None and span[0] <= opset <= span[1] for _, span in ranges):
        return
    written = "; ".join(f"{route.framework} -> {fmt} writes opsets {span[0]} to {span[1]} ({route.opsets_written_by})"
                        for route, span in ranges if span is not None)
    raise Incompatible(f"--opset {opset}: {written}; ask for one of those", kind="opset")


def route_for(framework: str, fmt: str, exporter: str = "auto", quantize: str | None = None) -> Route:
    if _key(framework, fmt) not in ROUTES:
        raise BadInput(f"no route exports {framework} models to {fmt} (formats: {', '.join(formats())})")
    route = ROUTES[_key(framework, fmt)]
    if exporter != "auto" and exporter not in route.exporters:
        raise BadInput(
            f"--exporter {exporter!r} does not export {framework} to {fmt} "
            f"(choose auto or one of {', '.join(route.exporters)})"
        )
    if quantize is not None and quantize not in route.quantize_modes:
        modes = f"choose one of {', '.join(route.quantize_modes)}" if route.quantize_modes else "it has none"
        raise BadInput(f"--quantize {quantize!r} is not an option of {framework} -> {fmt} ({modes})")
    return route



def route_with_past(route: Route, call: str, exporter: str = "auto", quantize: str | None = None) -> Route | None:
    """The route that exports a task with past (its model_tasks call) along `route`'s framework
    and format: `route` itself unless it exports fixed sizes, then its WITH_PAST route when that
    exports such a task (None otherwise)."""
    if not route.static_shapes:
        return route
    key = _key(route.framework, route.format)
    if key not in WITH_PAST or call not in WITH_PAST[key].calls:
        return None
    past = WITH_PAST[key]
    if exporter != "auto" and exporter not in past.exporters:
        raise BadInput(f"--exporter {exporter!r}: a task with past exports to {route.format} with "
                       f"{'/'.join(past.exporters)} only")
    if quantize is not None and quantize not in past.quantize_modes:
        raise BadInput(f"--quantize {quantize!r}: a task with past exports to {route.format} with "
                       f"{'/'.join(past.exporters)}, which has no such option")
    return past
