"""Export routes, one per (framework, format), found through a registry.

A route takes a Source and an ExportRequest, writes the artifact at the path it is given (plus any
external data beside it) and returns what it did. Exporter quirks stay inside the route that has them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from exporter.errors import BadInput
from exporter.sources import DynamicAxis, Source

Progress = Callable[[str], None]


@dataclass
class ExportRequest:
    format: str
    opset: int | None = None
    exporter: str = "auto"
    dynamic: list[DynamicAxis] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)  # the source's, given to the artifact
    sample_inputs: dict = field(default_factory=dict)  # one input batch, for tracing


@dataclass
class ExportResult:
    exporter: str  # what produced the artifact, e.g. "torch.onnx (dynamo)"
    notes: list[str] = field(default_factory=list)


class Route:
    framework: str
    format: str
    exporters: tuple[str, ...]  # values --exporter accepts besides "auto"

    def export(self, source: Source, request: ExportRequest, dest: Path, progress: Progress) -> ExportResult:
        raise NotImplementedError


ROUTES: dict[tuple[str, str], Route] = {}


def register(cls: type[Route]) -> type[Route]:
    ROUTES[(cls.framework, cls.format)] = cls()
    return cls


def formats() -> list[str]:
    return sorted({fmt for _, fmt in ROUTES})


def route_for(framework: str, fmt: str, exporter: str = "auto") -> Route:
    route = ROUTES.get((framework, fmt))
    if route is None:
        raise BadInput(f"no route exports {framework} models to {fmt} (formats: {', '.join(formats())})")
    if exporter != "auto" and exporter not in route.exporters:
        raise BadInput(
            f"--exporter {exporter!r} does not export {framework} to {fmt} "
            f"(choose auto or one of {', '.join(route.exporters)})"
        )
    return route


from exporter.routes import keras_onnx, torch_onnx  # noqa: E402,F401  (registration)
