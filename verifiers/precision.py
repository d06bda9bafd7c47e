"""The numeric precision of an artifact, and the checks of integer devices against it.

`Precision` says how an artifact computes: its mode, its inputs' and outputs' quantization and every
op that computes on a float tensor. Modes: "float" (float32 compute), "fp16" (float16 weights),
"dynamic-int8" (int8 weights, float activations), "int8" (every compute op on int8/uint8
activations, int32 biases allowed), "int16" (16-bit activations, 8-bit weights) and "mixed"
(integer ops with some float ops left, as a quantizer leaves what it skips). Each format reads
its own (verifiers.formats.onnx.precision, verifiers.formats.tflite.precision) from the ONNX
protobuf or the flatbuffer only: nothing runs, neither TensorFlow nor torch is imported.

`integer_device_incompatibilities` checks what the matrix says of integer devices (integer_only,
static_shapes, max_rank, max_inner_dims, ops) for every format.
"""

from __future__ import annotations

from dataclasses import dataclass

from verifiers.target_facts import Hits, Incompatibility, fact_sources, fact_text, finding_detail, locate, names_text
from verifiers.naming import shown
from verifiers.targets import Target

FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
_SIXTEEN_BIT = frozenset({"int16", "uint16"})


@dataclass(frozen=True)
class QuantizedIO:
    """A model input or output: its dtype and, when quantized, its scale and zero point."""

    name: str
    dtype: str
    scale: float | None = None
    zero_point: int | None = None


@dataclass(frozen=True)
class FloatOp:
    """An op that computes on a float activation or weight: `tensor` is the first such input."""

    node: str
    op_type: str
    tensor: str
    dtype: str


@dataclass(frozen=True)
class Precision:
    mode: str  # "float" | "fp16" | "dynamic-int8" | "int8" | "int16" | "mixed"
    inputs: tuple[QuantizedIO, ...]
    outputs: tuple[QuantizedIO, ...]
    float_ops: tuple[FloatOp, ...]  # in graph order, from the inputs to the outputs


_QUANTIZED = frozenset({"int8", "uint8"}) | _SIXTEEN_BIT  # what quantized activations are held in


def mode_of(float_ops: list[FloatOp], float_weights: set[str], int8_weights: bool, dynamic: bool,
          integer_activations: set[str]) -> str:
    """`integer_activations`: the dtypes integer ops compute on (token ids and shapes included)."""
    integer_activations = integer_activations & _QUANTIZED
    if not float_ops:
        return "int16" if integer_activations & _SIXTEEN_BIT else "int8"
    if "float16" in float_weights:
        return "fp16"
    if dynamic or int8_weights:
        return "dynamic-int8"
    return "mixed" if integer_activations else "float"


# ---- checks --------------------------------------------------------------------------------------------


def _lead(precision: Precision) -> str:
    """'float32 model', 'float16-weight model'...: what kind of model the mode is."""
    first = precision.float_ops[0].dtype if precision.float_ops else ""
    return {"float": f"{first} model", "fp16": "float16-weight model", "dynamic-int8": "dynamic-range int8 model",
            "mixed": "partly integer model", "int16": "16-bit integer model"}.get(precision.mode, "model")


def _float_op_detail(op: FloatOp) -> dict[str, str]:
    return {"node": op.node, "op": op.op_type, "tensor": op.tensor, "dtype": op.dtype}


def _precision_incompatibility(target: Target, precision: Precision, integer_fix: str) -> Incompatibility | None:
    requirement = (f"{target.name} runs only full-integer models with {', '.join(target.integer_dtypes)} "
                   f"activations {fact_text(target, 'integer_only', True)}")
    detail = {"mode": precision.mode, "fact": "integer_only", "integer_dtypes": list(target.integer_dtypes),
              "sources": fact_sources(target, "integer_only")}
    if precision.float_ops:
        first, n = precision.float_ops[0], len(precision.float_ops)
        message = (f"{_lead(precision)} (mode {precision.mode}): {first.op_type} at node {shown(first.node)} computes "
                   f"on {first.dtype} tensor {shown(first.tensor)}, first of {n} float op{'s' if n != 1 else ''}; "
                   f"{requirement}")
        return Incompatibility("precision", message, detail | {
            "first_float_op": _float_op_detail(first),
            "float_ops": [_float_op_detail(op) for op in precision.float_ops]}, integer_fix)
    width = _SIXTEEN_BIT if precision.mode == "int16" else frozenset({"int8", "uint8"})
    if width & set(target.integer_dtypes):
        return None
    return Incompatibility("precision", f"{_lead(precision)} (mode {precision.mode}); {requirement}",
                           detail | {"first_float_op": None, "float_ops": []}, integer_fix)


def integer_device_incompatibilities(target: Target, precision: Precision | None, dynamic_axes: list[tuple[str, int]],
                                     ops: list[tuple[str, str]], integer_fix: str,
                                     activations: list[tuple[str, tuple[int, ...]]] = ()) -> list[Incompatibility]:
    """What an artifact breaks of a target's integer-device facts: integer_only (against
    `precision`, None when the target claims nothing there), static_shapes (`dynamic_axes`:
    (input, axis)), ops (`ops`: (op, node) of every op) and, for `activations` ((tensor, dims)),
    max_rank and max_inner_dims. `integer_fix`: the export options that write a full-integer
    artifact of this format for an integer-only target."""
    out: list[Incompatibility] = []
    if target.integer_only and precision is not None:
        found = _precision_incompatibility(target, precision, integer_fix)
        if found is not None:
            out.append(found)
    if target.static_shapes and dynamic_axes:
        by_input: dict[str, list[int]] = {}
        for name, axis in dynamic_axes:
            by_input.setdefault(name, []).append(axis)
        if len(dynamic_axes) == 1:
            what = f"input {dynamic_axes[0][0]} axis {dynamic_axes[0][1]} is"
        else:
            what = "inputs " + ", ".join(f"{name} ({'axes' if len(axes) > 1 else 'axis'} {', '.join(map(str, axes))})"
                                         for name, axes in by_input.items()) + " are"
        out.append(Incompatibility("shape", (
            f"{what} dynamic; {target.name} takes only static shapes {fact_text(target, 'static_shapes', True)}"
        ), {"axes": [{"input": name, "axis": axis} for name, axis in dynamic_axes], "fact": "static_shapes",
            "sources": fact_sources(target, "static_shapes")}, fix=""))
    out.extend(_rank_incompatibilities(target, activations))
    if target.ops is not None:
        listed, hits = set(target.ops), Hits()
        for op, node in ops:
            if op not in listed:
                hits.add("unlisted", op, node, None)
        for group in hits.groups():
            _, where = locate(group, group["op"])
            out.append(Incompatibility("op", (
                f"{where}; {target.name} runs only the ops it lists {fact_text(target, 'ops', f'{len(listed)} ops')}"
            ), finding_detail(group, "ops", target)))
    return out


def _rank_incompatibilities(target: Target, activations) -> list[Incompatibility]:
    rules = []
    if target.max_rank is not None:
        limit = target.max_rank
        rules.append(("max_rank", limit, f"more than {limit} dimensions", lambda dims: len(dims) > limit))
    if target.max_inner_dims is not None:
        inner = target.max_inner_dims
        rules.append(("max_inner_dims", inner, f"a dimension other than 1 outside the {inner} innermost",
                      lambda dims: any(d != 1 for d in dims[:-inner])))
    out = []
    for fact, value, what, breaks in rules:
        tensors = [f"{name} {list(dims)}" for name, dims in activations if breaks(dims)]
        if tensors:
            n = len(tensors)
            out.append(Incompatibility("shape", (
                f"{n} activation tensor{'s' if n != 1 else ''} with {what} ({names_text(tensors)}); "
                f"{target.name} {fact_text(target, fact, value)}"
            ), {"tensors": tensors, "fact": fact, fact: value, "sources": fact_sources(target, fact)}))
    return out


def representable(scale: float, zero_point: int, dtype: str) -> tuple[float, float]:
    """The real values an integer tensor of `dtype` with this scale and zero point holds: what
    its calibration chose for it (values beyond are clamped)."""
    import numpy as np

    info = np.iinfo(np.dtype(dtype))
    return (float((info.min - zero_point) * scale), float((info.max - zero_point) * scale))
