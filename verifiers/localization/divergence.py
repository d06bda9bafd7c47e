"""Where an artifact first departs from its source, and whether each op made the error or received it.

Two runs of the artifact, each keeping every float tensor it computes (in chunks where memory
needs it), in its own runtime:
1. as it is: every anchor's error (verifiers.localization.align) is what the artifact gets there;
2. with every anchor's readers fed the source's value instead: each segment (the ops between
   anchors) then computes from exactly what the source had, so the error at its output is the
   error the segment introduces itself, not one it inherited.

A segment introduces an error when it exceeds a tolerance made from float32 rounding: ROUNDING_FACTOR
times the rounding of the source ops it stands for, each measured by recomputing the op in float64
(SourceTensor.rounding), and at least EPSILON_FACTOR epsilons of the artifact's precision times the
tensor's scale (UNMEASURED_FACTOR where some op's rounding was not measured). The first segment in
graph order that introduces one holds the first divergence. Inside it, the op is the first whose
output holds none of the source's values (the fine steps of split ops included) and from which the
error runs, through other such outputs only, to the segment's end.
"""

from __future__ import annotations

import tempfile

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from verifiers.localization.align import DATA_MOVES, Anchor, admissible, align, dialect_of, module_paths, resolve_scope
from verifiers.localization.graph import ArtifactGraph
from verifiers.localization.layouts import ValueIndex, max_abs, scale
from verifiers.localization.trace import MOVES, SourceTrace
from verifiers.naming import shown

PATH_LENGTH = 5  # steps listed after the first divergence
# Ops whose output holds their input's values in another shape: never where an error starts.
VALUE_PRESERVING = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "RESHAPE", "SQUEEZE",
                              "EXPAND_DIMS"})
ROUNDING_FACTOR = 16
EPSILON_FACTOR = 64
UNMEASURED_FACTOR = 1024
WEAK_EVIDENCE = ("inputs", "scope", "segment")  # a module said on these is checked against the weights


@dataclass(frozen=True)
class First:
    node: str
    index: int  # the op's position in the artifact's graph
    op_type: str
    module: str
    source: str | None  # "file.py:LINE"
    introduced_max_abs: float  # the segment's error at its end, computed from the source's values
    inherited_max_abs: float  # the largest error of what the segment reads, in the artifact as it is
    covers: tuple[str, ...]  # the source ops the op (or its segment) stands for
    tensor: str  # the anchor ending the segment
    tolerance: float
    evidence: str = "recorded"  # what says which module it is in (Judge._where)
    # its weights, when the module came from weak evidence: the model layer names the module whose
    # parameters they are (not part of the report)
    weights: tuple = field(default=(), repr=False, compare=False)


@dataclass(frozen=True)
class Step:
    node: str
    index: int
    op_type: str
    module: str
    source: str | None
    max_abs: float | None  # the artifact's error at this op's output (None: the source has no such tensor)
    introduced_max_abs: float | None
    inherited_max_abs: float | None


@dataclass(frozen=True)
class Point:
    """One anchor of the error profile along the graph (the HTML report plots them)."""

    order: int
    node: str
    max_abs: float
    introduced_max_abs: float
    tolerance: float


@dataclass(frozen=True)
class Overflow:
    """Where a run in a narrower float (float16) first leaves its range: the artifact's op whose
    value becomes Inf or NaN, and the source op whose values first reach beyond the range."""

    node: str
    index: int
    op_type: str
    values: int  # of its output's values, how many are Inf or NaN
    limit: float  # the largest finite value of the precision (float16: 65504)
    source_op: str | None = None  # the source's op, module and line, and how far its values reach
    module: str | None = None
    source: str | None = None
    source_max_abs: float | None = None


@dataclass(frozen=True)
class Divergence:
    first: First | None
    path: tuple[Step, ...]
    aligned: int
    profile: tuple[Point, ...] = ()
    computed: int = 0  # float tensors the artifact computes
    overflow: Overflow | None = None
    precision: str = "float32"  # the arithmetic whose rounding the tolerances are made of
    # constants the first diverging op reads that hold float16's largest value, where converters
    # clamp what float16 cannot hold
    clamped: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        first = {k: v for k, v in asdict(self.first).items() if k != "weights"} if self.first else None
        return {"first": first, "path": [asdict(s) for s in self.path],
                "aligned": self.aligned, "computed": self.computed,
                "profile": [asdict(p) for p in self.profile],
                "overflow": asdict(self.overflow) if self.overflow else None, "clamped": list(self.clamped)}

    def message(self, red: bool = False) -> str:
        """One line; `red`: the outputs were found to differ (then nothing diverging means the
        tolerances asked for are tighter than the arithmetic's rounding)."""
        first, overflow = self.first, self.overflow
        if overflow is not None:
            reach = ""
            if overflow.source_op is not None:
                where = f" ({overflow.source})" if overflow.source else ""
                reach = (f"; the source's {overflow.source_op} in {overflow.module or '<root>'}{where} reaches "
                         f"{overflow.source_max_abs:.3g}, beyond {self.precision}'s largest {overflow.limit:g}")
            return (f"first overflow in {self.precision}: {overflow.op_type} {shown(overflow.node)} makes "
                    f"{overflow.values} value(s) Inf or NaN{reach}")
        if first is not None:
            where = f" ({first.source})" if first.source else ""
            clamp = (f"; it reads {', '.join(map(shown, self.clamped))}, holding float16's largest value "
                     f"{FINITE_LIMITS['float16']:g}: a constant clamped by a float16 converter") if self.clamped else ""
            return (f"first divergence: {first.op_type} {shown(first.node)} in {first.module or '<root>'}{where}: "
                    f"introduces max abs err {first.introduced_max_abs:.3g}{clamp}")
        over = [p for p in self.profile if p.max_abs > p.tolerance]
        if over:
            worst = max(over, key=lambda p: p.max_abs)
            return (f"no op introduces more than {self.precision} rounding: the difference accumulates over {len(over)} "
                    f"aligned tensor(s), up to max abs err {worst.max_abs:.3g} at {shown(worst.node)}")
        if red:
            return (f"no op introduces more than {self.precision} rounding and all {self.aligned} aligned tensor(s) stay within "
                    "it: the outputs differ by rounding alone")
        return f"no divergence: {self.aligned} aligned tensor(s) agree with the source"


def localize(fmt, path: Path, trace: SourceTrace, feed: dict[str, np.ndarray], runner_class,
             epsilon: float = float(np.finfo(np.float32).eps), output_keys: dict[str, str] | None = None,
             variant: str | None = None) -> Divergence:
    """The divergence of the artifact at `path` (of format `fmt`, a verifiers.formats ArtifactFormat)
    from its source on one batch (`feed`, under the
    artifact's input names; `trace`, what the source computed on it; `output_keys`, the source
    tensor each artifact output was compared with), as the runtime's `variant` runs it (None: its
    own run; "float16": with float16 arithmetic emulated). Runs where it is called: the API calls it
    in the artifact's runtime worker."""
    if variant is not None:
        with tempfile.TemporaryDirectory(prefix="exportgate-variant-") as folder:
            return _localize(fmt, fmt.variant_model(path, variant, Path(folder)), trace, feed, runner_class, epsilon,
                             output_keys, variant)
    return _localize(fmt, path, trace, feed, runner_class, epsilon, output_keys)


def _localize(fmt, path: Path, trace: SourceTrace, feed: dict[str, np.ndarray], runner_class, epsilon: float,
              output_keys: dict[str, str] | None, narrow: str | None = None) -> Divergence:
    """localize on the model at `path`; `narrow`: the narrow float it computes in (float16), whose
    first overflow is looked for."""
    graph = fmt.localization_graph(path)
    plain = graph.run(feed, graph.computed_floats(), {}, runner_class)
    floats = graph.learn(plain)
    plain = {t: plain[t] for t in floats}
    anchors = align(graph, trace, plain, output_keys)
    judge = _Judge(graph, trace, anchors, plain, _forced(graph, trace, anchors, plain, feed, floats, runner_class),
                   epsilon)
    refolded = judge.refolded()
    if refolded:
        judge = _Judge(graph, trace, refolded, plain,
                       _forced(graph, trace, refolded, plain, feed, floats, runner_class), epsilon)
    found = judge.divergence(len(floats))
    found = replace(found, clamped=clamped_constants(graph, found))
    if narrow is None:
        return found
    return replace(found, precision=narrow, overflow=first_overflow(graph, plain, trace, feed, narrow))


def _nonfinite_constant(graph: ArtifactGraph, op) -> bool:
    """Whether a constant the op reads holds Inf or NaN (a mask's -inf, chosen on purpose)."""
    for tensor in op.inputs:
        if tensor and graph.tensors[tensor].constant:
            value = graph.constant(tensor)
            if value is not None and value.dtype.kind == "f" and not np.isfinite(value).all():
                return True
    return False


def clamped_constants(graph: ArtifactGraph, divergence: Divergence) -> tuple[str, ...]:
    """The constants the first diverging op reads that hold float16's largest magnitude (65504)."""
    if divergence.first is None:
        return ()
    limit = FINITE_LIMITS["float16"]
    found = []
    for tensor in graph.ops[divergence.first.index].inputs:
        producer = graph.tensors[tensor].producer if tensor else None
        if producer is not None and graph.ops[producer].op_type == "Cast":  # a weight cast as the graph runs
            tensor = graph.ops[producer].inputs[0]
        value = graph.constant(tensor) if tensor and graph.tensors[tensor].constant else None
        if value is not None and value.dtype.kind == "f" and np.any(np.abs(value.astype(np.float64)) == limit):
            found.append(graph.tensors[tensor].name)
    return tuple(found)


# The largest finite value of the narrow floats an artifact's tensors may hold.
FINITE_LIMITS = {"float16": float(np.finfo(np.float16).max)}


def first_overflow(graph: ArtifactGraph, plain: dict[str, np.ndarray], trace: SourceTrace,
                   feed: dict[str, np.ndarray], narrow: str) -> Overflow | None:
    """The first op, in the order the artifact runs them, that makes Inf or NaN from finite inputs
    and finite constants (`plain`: its float tensors, by id; a mask's -inf is no overflow), on a
    batch whose inputs are finite; a Cast that makes them stands for the op before it, whose value
    it narrows. The source op named beside it is the first whose values reach beyond the `narrow`
    float's range (None where none does)."""
    if not all(np.isfinite(value).all() for value in feed.values() if np.asarray(value).dtype.kind == "f"):
        return None
    for op in graph.ops:
        made = [plain[t] for t in op.outputs if t in plain]
        count = sum(int(np.size(v) - np.count_nonzero(np.isfinite(v))) for v in made)
        if not count or any(not np.isfinite(plain[t]).all() for t in op.inputs if t in plain) or _nonfinite_constant(
                graph, op):
            continue
        named = op
        if op.op_type == "Cast" and op.inputs and graph.tensors[op.inputs[0]].producer is not None:
            named = graph.ops[graph.tensors[op.inputs[0]].producer]
        limit = FINITE_LIMITS[narrow]
        beyond = next((t for t in trace.coarse() if t.is_float and t.value.size
                       and float(np.nanmax(np.abs(t.value))) > limit), None)
        return Overflow(named.name, named.index, named.op_type, count, limit,
                        *((beyond.op, beyond.module, beyond.location, float(np.nanmax(np.abs(beyond.value))))
                          if beyond is not None else ()))
    return None


def _forced(graph, trace, anchors, plain, feed, floats, runner_class) -> dict[str, np.ndarray]:
    """The run with every anchor's readers fed the source's value."""
    replace = {a.tensor: a.layout.to_artifact(trace[a.key].value).astype(plain[a.tensor].dtype) for a in anchors}
    return graph.run(feed, floats, replace, runner_class)


class _Judge:
    def __init__(self, graph: ArtifactGraph, trace: SourceTrace, anchors: list[Anchor], plain: dict, forced: dict,
                 epsilon: float):
        self.graph, self.trace, self.anchors = graph, trace, anchors
        self.plain, self.forced, self.epsilon = plain, forced, epsilon
        self.by_tensor = {a.tensor: a for a in anchors}
        self.modules = module_paths(trace)
        self.expected = {a.tensor: a.layout.to_artifact(trace[a.key].value) for a in anchors}
        self.dialect = dialect_of(anchors, trace, plain)
        self.held: dict[str, str] = {}  # a segment's step -> the source value it holds (see _chain)

    def refolded(self) -> list[Anchor] | None:
        """The anchors again with the first diverging one taken for the step it holds, when it has
        that alternative and a segment reading it diverges too: the op's last step was folded into
        its readers, and the module output the anchor stood for is not in the artifact. None when
        nothing is to change."""
        diverging = [a for a in self.anchors if self._introduced(a) > self._tolerance(a)]
        if not diverging or diverging[0].alternative is None:
            return None
        first = diverging[0]
        if not any(first in self._boundary(a) for a in diverging[1:]):
            return None
        key, layout = first.alternative
        return [replace(a, key=key, layout=layout, how="value", alternative=None) if a is first else a
                for a in self.anchors]

    def _introduced(self, anchor: Anchor) -> float:
        return max_abs(self.forced[anchor.tensor], self.expected[anchor.tensor])

    def divergence(self, computed: int) -> Divergence:
        points, first_anchor = [], None
        for anchor in self.anchors:
            expected = self.expected[anchor.tensor]
            plain_error = max_abs(self.plain[anchor.tensor], expected)
            introduced = max_abs(self.forced[anchor.tensor], expected)
            tolerance = self._tolerance(anchor)
            points.append(Point(anchor.order, self.graph.ops[anchor.order].name, plain_error, introduced, tolerance))
            if first_anchor is None and introduced > tolerance:
                first_anchor = (anchor, introduced, tolerance)
        if first_anchor is None:
            return Divergence(None, (), len(self.anchors), tuple(points), computed)
        anchor, introduced, tolerance = first_anchor
        chain = self._chain(anchor)
        culprit = self.graph.ops[chain[0]]
        module, location, evidence = self._where(culprit, anchor)
        first = First(culprit.name, culprit.index, culprit.op_type, module, location, introduced, self._inherited(anchor),
                      self._covers(culprit, anchor), anchor.tensor, tolerance, evidence,
                      self.graph.weights(culprit) if evidence in WEAK_EVIDENCE else ())
        return Divergence(first, self._path(anchor, chain, points), len(self.anchors), tuple(points), computed)

    # ---- segments ------------------------------------------------------------------------------

    def _segment(self, anchor: Anchor) -> list[int]:
        """The ops computing the anchor from other anchors, constants and graph inputs, in order."""
        graph, found, todo = self.graph, set(), [anchor.tensor]
        while todo:
            tensor = graph.tensors.get(todo.pop())
            if tensor is None or tensor.producer is None or tensor.constant or tensor.producer in found:
                continue
            found.add(tensor.producer)
            todo.extend(t for t in graph.ops[tensor.producer].inputs if t and t not in self.by_tensor)
        return sorted(found)

    def _boundary(self, anchor: Anchor) -> list[Anchor]:
        return [self.by_tensor[t] for i in self._segment(anchor) for t in self.graph.ops[i].inputs
                if t in self.by_tensor and t != anchor.tensor]

    def _covered(self, anchor: Anchor) -> list[str]:
        """The source ops the segment stands for: what the anchor's source tensor is computed from,
        back to the source tensors the segment reads (for a step of a split op, the op's inputs:
        the segment finishes the op)."""
        trace, stop = self.trace, set()
        for boundary in self._boundary(anchor):
            parent = trace[boundary.key].parent
            if boundary.key == anchor.key:  # it reads the op's own value (a MatMul before a zero bias)
                parent = boundary.key
            stop.update(trace[parent].inputs if parent is not None else (boundary.key,))
        return trace.ancestors(anchor.key, stop)

    def _tolerance(self, anchor: Anchor) -> float:
        source = self.trace[anchor.key]
        floats = [self.trace[k] for k in self._covered(anchor) if self.trace[k].is_float]
        measured = [t.rounding for t in floats if t.rounding is not None]
        size = scale(source.value)
        if floats and len(measured) == len(floats):
            return max(ROUNDING_FACTOR * sum(measured), EPSILON_FACTOR * self.epsilon * size)
        return UNMEASURED_FACTOR * self.epsilon * size

    def _inherited(self, anchor: Anchor) -> float:
        errors = [max_abs(self.plain[b.tensor], self.expected[b.tensor]) for b in self._boundary(anchor)]
        return max(errors, default=0.0)

    def _chain(self, anchor: Anchor) -> list[int]:
        """The ops of the segment the error runs through, from the first that made it to the
        anchor's producer (see the module docstring)."""
        graph, segment = self.graph, self._segment(anchor)
        index = ValueIndex(self._local_values(anchor), self.dialect)
        dirty: dict[str, bool] = {}

        def is_dirty(tensor_id: str) -> bool:
            if tensor_id not in dirty:
                value = self.forced.get(tensor_id)
                op = graph.ops[graph.tensors[tensor_id].producer]
                matches = [] if value is None else index.match(value, lambda key: admissible(op, self.trace, key))
                if matches:
                    self.held[tensor_id] = matches[0][0]
                dirty[tensor_id] = value is not None and not matches
            return dirty[tensor_id]

        reached = {graph.tensors[anchor.tensor].producer}
        todo = [graph.tensors[anchor.tensor].producer]
        members = set(segment)
        while todo:
            op = graph.ops[todo.pop()]
            for tensor_id in op.inputs:
                tensor = graph.tensors.get(tensor_id)
                if (tensor is None or tensor.producer is None or tensor.producer not in members
                        or tensor.producer in reached or not tensor.is_float or not is_dirty(tensor_id)):
                    continue
                reached.add(tensor.producer)
                todo.append(tensor.producer)
        chain = sorted(reached)
        while graph.ops[chain[0]].op_type in VALUE_PRESERVING:  # it gives out what it takes in: the error came in
            source = graph.tensors.get(graph.ops[chain[0]].inputs[0])
            if source is None or source.producer is None or source.producer not in members or source.constant:
                break
            chain.insert(0, source.producer)
        return chain

    def _local_values(self, anchor: Anchor) -> dict[str, np.ndarray]:
        """The source's values a step of the segment may hold: what the segment reads, what its
        source ops compute, and their fine steps."""
        trace = self.trace
        covered = self._covered(anchor)
        keys = {b.key for b in self._boundary(anchor)} | set(covered)
        keys |= {k for key in covered for k in trace[key].inputs}
        keys |= {t.key for key in covered for t in trace.fine(key)}
        return {k: trace[k].value for k in keys if k in trace and trace[k].is_float}

    # ---- what the report says ------------------------------------------------------------------

    def _where(self, op, anchor: Anchor) -> tuple[str, str | None, str]:
        """The source module and line of an op of the artifact, and what says so: "recorded" (the
        exporter named the source op), "anchor" (the op computes the segment's end), "inputs" (the
        source op that goes on from what the op reads), "scope" (the module scope the exporter
        recorded) or "segment" (the segment's end, for want of better)."""
        trace = self.trace
        for key in filter(None, map(trace.resolve, op.keys)):
            return trace[key].module, trace[key].location, "recorded"
        if anchor.tensor in op.outputs:
            key = anchor.key if op.op_type in DATA_MOVES else self._computed(anchor.key)
            return trace[key].module, trace[key].location, "anchor"
        continued = self._continued(op, anchor)
        if continued is not None:
            return trace[continued].module, trace[continued].location, "inputs"
        module = resolve_scope(op.scope, self.modules, trace.separator)
        if module is not None:
            inside = [trace[k] for k in self._covered(anchor) if trace[k].module == module]
            return module, (inside[-1] if inside else trace[anchor.key]).location, "scope"
        return trace[anchor.key].module, trace[anchor.key].location, "segment"

    def _continued(self, op, anchor: Anchor) -> str | None:
        """The source op an op of the segment goes on with: the op whose step one of its inputs
        holds, else the first source op of the segment that computes from what its inputs hold."""
        trace, covered = self.trace, self._covered(anchor)
        held = [self.by_tensor[t].key if t in self.by_tensor else self.held.get(t) for t in op.inputs if t]
        for key in filter(None, held):
            if trace[key].parent is not None:
                return trace[key].parent
        held = {k for k in held if k}
        if op.op_type in DATA_MOVES:  # a transpose or a reshape goes on with the source's own
            moving = [key for key in covered if trace[key].op in MOVES and held & set(trace[key].inputs)]
            if moving:
                return moving[0]
        for key in covered:  # what a copy or a view of a held value holds is held too
            if trace[key].op in MOVES and held & set(trace[key].inputs):
                held.add(key)
        computing = [key for key in covered if trace[key].op not in MOVES and held & set(trace[key].inputs)]
        return computing[0] if computing else None

    def _computed(self, key: str) -> str:
        """The op that computed a value, back through the copies and views that hold it (a
        dropout's copy in inference holds what the layer before it computed)."""
        trace = self.trace
        while trace[key].op in MOVES and len(trace[key].inputs) == 1 and trace[key].inputs[0] in trace:
            key = trace[key].inputs[0]
        return key

    def _covers(self, op, anchor: Anchor) -> tuple[str, ...]:
        """The source ops the op stands for: those the exporter names it after, else what its
        segment computes (copies and views left out)."""
        own = list(dict.fromkeys(filter(None, map(self.trace.resolve, op.keys))))
        covered = self._covered(anchor)
        return tuple(own or [k for k in covered if self.trace[k].op not in MOVES] or covered)

    def _path(self, anchor: Anchor, chain: list[int], points: list) -> tuple[Step, ...]:
        steps = []
        for index in chain[1:]:
            op = self.graph.ops[index]
            module, location, _ = self._where(op, anchor)
            ends = anchor.tensor in op.outputs
            steps.append(Step(op.name, op.index, op.op_type, module, location,
                              max_abs(self.plain[anchor.tensor], self.expected[anchor.tensor]) if ends else None,
                              max_abs(self.forced[anchor.tensor], self.expected[anchor.tensor]) if ends else None,
                              self._inherited(anchor) if ends else None))
        later = [(a, p) for a, p in zip(self.anchors, points) if a.order > anchor.order and p.max_abs > p.tolerance]
        seen = set(chain)
        for other, point in later:
            if len(steps) >= PATH_LENGTH:
                break
            if other.order in seen:
                continue
            seen.add(other.order)
            op = self.graph.ops[other.order]
            source = self.trace[other.key]
            steps.append(Step(op.name, op.index, op.op_type, source.module, source.location, point.max_abs,
                              point.introduced_max_abs, self._inherited(other)))
        return tuple(steps[:PATH_LENGTH])
