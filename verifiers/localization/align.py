"""Which artifact tensors hold which source tensors (anchors), from what the exporter recorded and
what the artifact computed on the clean part of the graph.

In order of trust:
1. names: a tensor the exporter named after a source tensor (dynamo's FX node names, TensorFlow
   tensor names kept by tf2onnx and the TFLite converter) holds it, in the layout its values
   say (only the identity where the shapes are equal);
2. module outputs: where the exporter records only module scopes (the TorchScript exporter,
   litert-torch), the last tensor computed inside a module's scope and read outside it holds the
   module's output;
3. values: any other float tensor that holds a source tensor's values within MATCH_RTOL, in the
   run of the artifact as it is (the clean part of the graph, where nothing diverged yet). An op
   that computes (not one that only moves data) makes a new value: its output is never taken for
   the tensor one of its inputs holds. Fine values (steps of a split op) are not anchors: they
   serve to pin a fault inside a segment (verifiers.localization.divergence).

Scopes are read in the exporter's spelling (verifiers.localization.graph.Scope) and resolved to the
source's module paths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from verifiers.localization.graph import ArtifactGraph, Scope
from verifiers.localization.layouts import MATCH_RTOL, Layout, ValueIndex, best_layout, layouts, scale
from verifiers.localization.trace import SourceTrace

# Ops that only move, reshape or relabel data: their output may hold the same source tensor as their input.
DATA_MOVES = frozenset({
    "Reshape", "Transpose", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Dropout", "Cast",
    "RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS", "BROADCAST_TO", "CAST",
})


# What computes activations, in the source's traces: an op with an activation fused in holds one of these.
ACTIVATIONS = frozenset({
    "aten.relu", "aten.relu6", "aten.hardtanh", "aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.tanh",
    "aten.sigmoid", "aten.leaky_relu", "aten.elu", "aten.hardswish", "aten.silu", "aten.gelu",
    "Relu", "Relu6", "Tanh", "Sigmoid", "Elu", "LeakyRelu", "Selu", "Softplus", "Minimum", "Maximum",
})
_CALL_SUFFIX = re.compile(r"_\d+$")
NAME_HOPS = 2  # how far after a named tensor a lowering may put the value its name stands for
RETURN_HOPS = 4  # how soon after a fine value the computation must return to the source's values


@dataclass
class Anchor:
    tensor: str  # the artifact's tensor id
    key: str  # the source tensor it holds
    layout: Layout
    how: str  # "name", "module" or "value"
    order: int  # its producer's position in the artifact's graph
    # a module output that holds a step of the op instead (key, layout): the op's last step may have
    # been folded forward into what reads it (verifiers.localization.divergence decides)
    alternative: tuple[str, Layout] | None = None


def resolve_scope(scope: Scope | None, modules: set[str], separator: str) -> str | None:
    """The source module path an exporter's scope names (None when it names none the source has)."""
    if scope is None:
        return None
    parts = scope.parts
    if scope.style == "module":
        return _known_suffix(parts, modules, separator)
    if scope.style == "tf":  # name scopes: Keras layers' (a call may suffix them "_N"), and ops' own
        path = ""
        for part in parts:
            for spelling in (part, _CALL_SUFFIX.sub("", part)):
                deeper = f"{path}{separator}{spelling}" if path else spelling
                if deeper in modules:
                    path = deeper
                    break
        return path
    if scope.style == "torchscript":
        path, previous = "", None
        for part in parts:
            child = part[len(previous) + 1:] if previous and part.startswith(previous + ".") else part
            path = f"{path}.{child}" if path else child
            previous = part
        return _known_suffix(tuple(path.split(".")) if path else (), modules, ".")
    if scope.style == "classes":  # litert-torch: "pkg.Class_attribute" per level below the root's class
        path = ""
        for part in parts[1:]:
            path = _attribute_child(path, part, modules)
            if path is None:
                return None
        return path
    return None


def _known_suffix(parts: tuple[str, ...], modules: set[str], separator: str) -> str:
    """The deepest module the parts name, past any wrapper levels the source does not have (an
    exporter's wrapper module, a model's name scope): the longest run of parts, from any level
    down, that is a known module path; the root when none is."""
    best, length = "", 0
    for start in range(len(parts)):
        for end in range(len(parts), start + length, -1):
            path = separator.join(parts[start:end])
            if path in modules:
                best, length = path, end - start
                break
    return best


def _attribute_child(path: str, part: str, modules: set[str]) -> str | None:
    """The module below `path` that `Class_attribute` names: the attribute is what follows one of
    the underscores (class and attribute names both hold them); a list's child skips the list's
    own level (`encoder.layer.0` for `BertLayer_0` below `encoder`)."""
    prefix = f"{path}." if path else ""
    for index, char in enumerate(part):
        if char != "_":
            continue
        attribute = part[index + 1:]
        if f"{prefix}{attribute}" in modules:
            return f"{prefix}{attribute}"
        nested = [m for m in modules if m.startswith(prefix) and m.endswith("." + attribute)
                  and m.count(".") == prefix.count(".") + 1]
        if len(nested) == 1:
            return nested[0]
    return None


def holding(source: np.ndarray, value: np.ndarray, dialect: frozenset = frozenset()) -> tuple[Layout, float] | None:
    """(layout, max abs error) under which `value` holds `source` within MATCH_RTOL, else None."""
    if source.size != value.size:
        return None
    best = best_layout(source, value, dialect=dialect)
    return best if best is not None and best[1] <= MATCH_RTOL * scale(source) else None


def admissible(op, trace: SourceTrace, key: str) -> bool:
    """Whether an op of the artifact may hold the source tensor `key`: one with an activation fused
    in holds an activation's output; one that adds a bias of its own never holds a tensor the
    source goes on to add a bias to (the step before it: a fault that zeroes the bias leaves it)."""
    source = trace[key]
    if op.activation is not None and source.op not in ACTIVATIONS:
        return False
    return not (op.bias and key in trace.biased)


def module_paths(trace: SourceTrace) -> set[str]:
    found = {""}
    for tensor in trace.tensors.values():
        found.update(trace.enclosing(tensor.module))
    return found


def align(graph: ArtifactGraph, trace: SourceTrace, plain: dict[str, np.ndarray],
          output_keys: dict[str, str] | None = None) -> list[Anchor]:
    """The anchors of the artifact's computed float tensors, in graph order (see the module
    docstring); `output_keys` pairs the artifact's outputs (by name) with the source's, as the
    comparison paired them."""
    modules = module_paths(trace)
    coarse = {t.key: t for t in trace.coarse() if t.is_float}
    scopes = {op.index: resolve_scope(op.scope, modules, trace.separator) for op in graph.ops}
    found: dict[str, Anchor] = {}
    computed = [t for t in graph.computed_floats() if t in plain]
    named = {graph.output_names[name]: (key,) for name, key in (output_keys or {}).items()
             if name in graph.output_names and key is not None}

    unconfirmed: dict[str, list[str]] = {}  # tensor -> the keys its names give, none of which it holds
    for tensor_id in computed:  # 1. names
        tensor = graph.tensors[tensor_id]
        op = graph.ops[tensor.producer]
        keys = [key for key in dict.fromkeys(trace.resolve(k) for k in tensor.keys) if key in coarse
                and coarse[key].value.size == plain[tensor_id].size and admissible(op, trace, key)]
        outputs = [key for key in named.get(tensor_id, ()) if key in coarse and coarse[key].value.size == plain[tensor_id].size]
        held = [(key, holding(coarse[key].value, plain[tensor_id])) for key in (*outputs, *keys)]
        held = [(key, *best) for key, best in held if best is not None]
        if held:
            key, layout, _ = min(held, key=lambda item: item[2])
            found[tensor_id] = Anchor(tensor_id, key, layout, "name", tensor.producer)
        elif outputs:  # what the comparison compared holds the output, whatever it holds
            found[tensor_id] = Anchor(tensor_id, outputs[0], layouts(coarse[outputs[0]].value.shape,
                                                                    plain[tensor_id].shape)[0], "name", tensor.producer)
        elif keys:
            unconfirmed[tensor_id] = sorted(keys, key=lambda k: coarse[k].order, reverse=True)

    index = ValueIndex({key: t.value for key, t in coarse.items()})  # 2. values
    _by_value(graph, trace, plain, computed, found, index, scopes, coarse)
    dialect = dialect_of(found.values(), trace, plain)
    if dialect:  # again, now that the artifact's layouts are known; and names held in them
        _by_value(graph, trace, plain, computed, found, ValueIndex(index.values, dialect), scopes, coarse)
        for anchor in found.values():
            source = coarse[anchor.key].value
            if anchor.layout.identity and source.shape == plain[anchor.tensor].shape and \
                    holding(source, plain[anchor.tensor]) is None:
                best = holding(source, plain[anchor.tensor], dialect)
                if best is not None:
                    anchor.layout = best[0]

    steps = _by_fine_value(graph, trace, plain, computed, found, dialect)
    _by_unconfirmed_name(graph, plain, unconfirmed, found, coarse, dialect)

    if any(scope is not None for scope in scopes.values()):  # 3. module outputs
        for module, key in trace.module_outputs().items():
            tensor_id = _module_output(graph, scopes, module, trace, plain, coarse[key].value.size)
            if tensor_id is not None and tensor_id not in found:
                best = best_layout(coarse[key].value, plain[tensor_id], dialect=dialect)
                if best is not None:
                    found[tensor_id] = Anchor(tensor_id, key, best[0], "module", graph.tensors[tensor_id].producer,
                                              steps.get(tensor_id))
    return sorted(found.values(), key=lambda a: (a.order, graph.ops[a.order].outputs.index(a.tensor)))


def _by_value(graph: ArtifactGraph, trace: SourceTrace, plain: dict[str, np.ndarray], computed: list[str],
              found: dict[str, Anchor], index: ValueIndex, scopes: dict[int, str | None], coarse: dict) -> None:
    """Anchor each tensor not anchored yet to the source tensor it holds by value, in graph order."""
    for tensor_id in computed:
        if tensor_id in found:
            continue
        op = graph.ops[graph.tensors[tensor_id].producer]
        made_from = {found[t].key for t in op.inputs if t in found}
        order_floor = max((coarse[k].order for k in made_from), default=-1)
        moves = op.op_type in DATA_MOVES

        def allowed(key, moves=moves, made_from=made_from, order_floor=order_floor, op=op):
            if key in made_from:
                return moves
            return coarse[key].order > order_floor and admissible(op, trace, key)

        matches = index.match(plain[tensor_id], allowed)
        scope = scopes.get(op.index)
        if scope is not None and matches:
            inside = [m for m in matches if trace.inside(coarse[m[0]].module, scope)]
            matches = inside or matches
        if matches:
            key, layout, _ = matches[0]
            found[tensor_id] = Anchor(tensor_id, key, layout, "value", op.index)


def _by_unconfirmed_name(graph: ArtifactGraph, plain: dict[str, np.ndarray], unconfirmed: dict[str, list[str]],
                         found: dict[str, Anchor], coarse: dict, dialect: frozenset) -> None:
    """A tensor named after a source tensor whose value it does not hold: when a tensor computed
    from it a step or two later holds that value, the exporter named the first op of a lowering
    after the source op (tf2onnx's SquaredDifference as Sub, then Mul) and the name moves there;
    else, where nothing holds it by value either, the artifact computes it wrong: anchored by its
    name (the last source tensor among its names), in the layout its shape gives."""
    for tensor_id, keys in unconfirmed.items():
        if tensor_id in found:
            continue
        key = keys[0]
        later = _later(graph, tensor_id, NAME_HOPS)
        holders = [(t, holding(coarse[key].value, plain[t], dialect)) for t in later if t in plain]
        holders = [(t, best) for t, best in holders if best is not None]
        if holders:
            holder, (layout, _) = holders[0]
            if holder not in found:
                found[holder] = Anchor(holder, key, layout, "name", graph.tensors[holder].producer)
            continue
        candidates = layouts(coarse[key].value.shape, plain[tensor_id].shape, dialect)
        if candidates:
            found[tensor_id] = Anchor(tensor_id, key, candidates[0], "name", graph.tensors[tensor_id].producer)


def _later(graph: ArtifactGraph, tensor_id: str, hops: int) -> list[str]:
    """The tensors computed from `tensor_id` within `hops` ops, nearest first."""
    found, frontier = [], [tensor_id]
    for _ in range(hops):
        frontier = [out for t in frontier for reader in graph.tensors[t].readers for out in graph.ops[reader].outputs
                    if out in graph.tensors and out not in found]
        found.extend(frontier)
    return found


def _by_fine_value(graph: ArtifactGraph, trace: SourceTrace, plain: dict[str, np.ndarray], computed: list[str],
                   found: dict[str, Anchor], dialect: frozenset) -> dict[str, tuple[str, Layout]]:
    """Anchor a tensor that holds a fine value (a step of a split op) when the computation returns
    to the source's values right after it (an exporter folded the op's last step forward: a
    LayerNorm's scale into the linear layer reading it); a step the artifact stops at, as a fault
    that drops a bias would, is left unanchored: returned, tensor -> (step, layout)."""
    index = ValueIndex({t.key: t.value for t in trace.tensors.values() if t.parent is not None and t.is_float},
                       dialect)
    left = {}
    for tensor_id in computed:
        if tensor_id in found:
            continue
        matches = index.match(plain[tensor_id])
        if not matches:
            continue
        key, layout, _ = matches[0]
        if _returns(graph, tensor_id, found):
            found[tensor_id] = Anchor(tensor_id, key, layout, "value", graph.tensors[tensor_id].producer)
        else:
            left[tensor_id] = (key, layout)
    return left


def _returns(graph: ArtifactGraph, tensor_id: str, found: dict[str, Anchor], hops: int = RETURN_HOPS) -> bool:
    """Whether an op at most `hops` ops after the tensor computes a tensor anchored by value."""
    return any(t in found and found[t].how == "value" for t in _later(graph, tensor_id, hops))


def dialect_of(anchors, trace: SourceTrace, plain: dict[str, np.ndarray]) -> frozenset[tuple[int, ...]]:
    """The permutations the artifact holds source tensors in, seen where they are unambiguous (the
    shapes differ, so no equal-shape identity could have been meant)."""
    return frozenset(a.layout.perm for a in anchors if not a.layout.identity
                     and trace[a.key].value.shape != plain[a.tensor].shape
                     and len(trace[a.key].value.shape) == len(plain[a.tensor].shape))


def _module_output(graph: ArtifactGraph, scopes: dict[int, str | None], module: str, trace: SourceTrace,
                   plain: dict[str, np.ndarray], size: int) -> str | None:
    """The last float tensor computed in `module`'s scope that an op outside the scope reads (or
    the graph returns), when it has the module output's element count."""
    inside = {i for i, scope in scopes.items() if scope is not None and trace.inside(scope, module)}
    if not inside:
        return None
    outputs = set(graph.outputs)
    for index in sorted(inside, reverse=True):
        for tensor_id in graph.ops[index].outputs:
            tensor = graph.tensors.get(tensor_id)
            if tensor is None or tensor_id not in plain or not tensor.is_float:
                continue
            if tensor_id in outputs or any(r not in inside for r in tensor.readers):
                return tensor_id if plain[tensor_id].size == size else None
    return None
