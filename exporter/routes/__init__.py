"""Export routes, one per (framework, format), found through a lazy registry (a route's module is
imported only when a command exports along it or asks what it accepts).

A route takes a Source and an ExportRequest, writes the artifact at the path it is given (plus any
external data beside it) and returns what it did. Exporter quirks stay inside the route that has them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from verifiers.errors import BadInput
from verifiers.registry import LazyRegistry
from exporter.sources import Source
from verifiers.sizes import DynamicAxis

Progress = Callable[[str], None]


@dataclass
class ExportRequest:
    format: str
    opset: int | None = None
    exporter: str = "auto"
    dynamic: list[DynamicAxis] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)  # the source's, given to the artifact
    sample_inputs: dict = field(default_factory=dict)  # one input batch, for tracing
    quantize: str | None = None  # TFLite only: None, "fp16" (float16 weights) or "dynamic-int8" (dynamic range)


@dataclass
class ExportResult:
    exporter: str  # what produced the artifact, e.g. "torch.onnx (dynamo)"
    notes: list[str] = field(default_factory=list)
    # Why a dynamic axis may not hold at other sizes, seen while exporting (report.dynamic_hints).
    hints: list[dict] = field(default_factory=list)


class Route:
    framework: str
    format: str
    exporters: tuple[str, ...]  # values --exporter accepts besides "auto"
    quantize_modes: tuple[str, ...] = ()  # values --quantize accepts

    def export(self, source: Source, request: ExportRequest, dest: Path, progress: Progress) -> ExportResult:
        raise NotImplementedError


ROUTES: LazyRegistry[Route] = LazyRegistry("route", {
    "torch->onnx": "exporter.routes.torch_onnx:TorchToOnnx",
    "keras->onnx": "exporter.routes.keras_onnx:KerasToOnnx",
    "keras->tflite": "exporter.routes.keras_tflite:KerasToTflite",
    "torch->tflite": "exporter.routes.torch_tflite:TorchToTflite",
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
        raise BadInput(f"--to {fmt!r}: choose one of {', '.join(formats())}")
    exporters = sorted({name for route in routes for name in route.exporters})
    if exporter != "auto" and exporter not in exporters:
        raise BadInput(f"--exporter {exporter!r} does not export to {fmt} (choose auto or one of {', '.join(exporters)})")
    modes = sorted({mode for route in routes for mode in route.quantize_modes})
    if quantize is not None and quantize not in modes:
        choice = f"choose one of {', '.join(modes)}" if modes else "it has none"
        raise BadInput(f"--quantize {quantize!r} is not an option of {fmt} exports ({choice})")


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

