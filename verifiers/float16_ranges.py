"""How far each op's values reach, measured by running a float32 artifact op by op: what decides
which ops a float16 export keeps in float32 (exporter.routes.onnx_float16).

For every op: the largest magnitude among the activations it reads and among the values it
writes, and the share of the nonzero activations it reads that float16 holds only as subnormals
(below its smallest normal, 6.1e-5, where precision falls away) or not at all. Runs in the
artifact's runtime worker (the runner class runs the graph with every tensor kept), batch by batch;
only the figures are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verifiers.runtimes.isolation import counted

FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504
FLOAT16_SMALLEST_NORMAL = float(np.finfo(np.float16).tiny)  # 6.1e-5


@dataclass
class OpRange:
    node: str
    op_type: str
    scope: str = ""  # the module path the exporter recorded for it, "." between parts ("" where none)
    reads_max: float = 0.0  # the largest |value| among the activations it reads
    writes_max: float = 0.0  # the largest |value| it writes
    tiny: int = 0  # nonzero activation values it reads below float16's smallest normal
    nonzero: int = 0  # nonzero activation values it reads

    @property
    def reach(self) -> float:
        """The largest |value| it reads or writes."""
        return max(self.reads_max, self.writes_max)

    @property
    def tiny_fraction(self) -> float:
        return self.tiny / self.nonzero if self.nonzero else 0.0


def measure(fmt, path, feeds: list[dict[str, np.ndarray]], runner_class) -> list[OpRange]:
    """Every op of the artifact at `path` (format `fmt`), in graph order, with how far its values
    reach over `feeds` (under the artifact's input names)."""
    graph = fmt.localization_graph(path)
    ranges = [OpRange(op.name, op.op_type, ".".join(op.scope.parts) if op.scope else "") for op in graph.ops]
    for feed in counted(feeds):
        values = {**{graph.inputs[name]: value for name, value in feed.items() if name in graph.inputs},
                  **graph.run(feed, graph.computed_floats(), {}, runner_class)}
        figures = {tensor: _figures(value) for tensor, value in values.items()
                   if np.asarray(value).dtype.kind == "f" and np.size(value)}  # once a tensor, however many read it
        for op, found in zip(graph.ops, ranges):
            for tensor in op.inputs:
                if tensor in figures and not graph.tensors[tensor].constant:
                    largest, nonzero, tiny = figures[tensor]
                    found.reads_max = max(found.reads_max, largest)
                    found.nonzero += nonzero
                    found.tiny += tiny
            for tensor in op.outputs:
                if tensor in figures:
                    found.writes_max = max(found.writes_max, figures[tensor][0])
    return ranges


def _figures(value: np.ndarray) -> tuple[float, int, int]:
    """A float tensor's largest |value|, its nonzero values, and those below float16's smallest normal."""
    magnitude = np.abs(np.asarray(value, np.float64))
    nonzero = magnitude[magnitude > 0]
    return float(magnitude.max()), int(nonzero.size), int(np.count_nonzero(nonzero < FLOAT16_SMALLEST_NORMAL))
