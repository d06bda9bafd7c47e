"""The matrix facts the target checks cite, and the grouping of what they find into messages.

An Incompatibility is one thing in an artifact a target lacks; each format's checks
(verifiers/formats/) collect hits with `Hits`, group them by reason and op, and phrase each with
the fact it breaks and its source (`fact_text`, `cite`), abbreviated.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from verifiers.naming import shown
from verifiers.targets import OpGap, Target
from verifiers.tflite_runtime_versions import version_key

KINDS = ("opset", "ir_version", "op", "dtype", "gelu", "runtime_version", "format", "precision", "shape")
_SHOWN = 3  # node names listed in a message before "and N more"
_QUOTE_CHARS = 60


@dataclass(frozen=True)
class Incompatibility:
    """One thing in the artifact the target lacks.

    kind: one of KINDS ("precision": float compute on an integer-only target, "shape": a dynamic
    axis or a rank the target does not take); message: one line
    (what, where, the matrix fact and its source); detail: machine-readable facts (site, nodes,
    op, fact key, target value, sources...); fix: the `exportgate export` options that write what
    the target takes, beside --target ("": --target alone does, as for a GELU form, an opset or
    static sizes), None when no export option does (an op the target lacks).
    """

    kind: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)
    fix: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown incompatibility kind {self.kind!r}")


# ---- matrix facts -------------------------------------------------------------------------------


def _abbreviate(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _short_source(source: str) -> str:
    return re.sub(r"^https?://(www\.)?", "", source)


def cite(target: Target, fact: str) -> str:
    """'source: <where> "<quote>"' for the first source of a fact, abbreviated ('' if none)."""
    for s in target.sources:
        if s.fact == fact:
            return f'source: {_short_source(s.source)} "{_abbreviate(s.quote, _QUOTE_CHARS)}"'
    return ""


def fact_sources(target: Target, fact: str) -> list[dict[str, str]]:
    return [{"source": s.source, "quote": s.quote} for s in target.sources if s.fact == fact]


def fact_text(target: Target, fact: str, value: Any) -> str:
    """'(fact: value; source: ...)'."""
    shown = str(value).lower() if isinstance(value, bool) else value
    source = cite(target, fact)
    return f"({fact}: {shown}; {source})" if source else f"({fact}: {shown})"


def is_onnxruntime(target: Target) -> bool:
    return target.runtime.lower().startswith("onnxruntime")


def delegate_of(target: Target) -> str | None:
    """The delegate or device part of a target name (tflite-2.9-gpu -> gpu), None for a plain runtime."""
    prefix = f"{target.runtime}-{target.version}-"
    return target.name[len(prefix):] if target.name.startswith(prefix) else None


_DTYPE_WORDS = (
    "float64", "float32", "float16", "bfloat16", "fp8", "fp4", "int64", "int32", "int16", "int8", "int4",
    "uint64", "uint32", "uint16", "uint8", "uint4", "bool", "string", "complex64", "complex128",
)
_QUALIFIED_OP = re.compile(r"^\s*([\w.]+)\s*(?:\[(\w+)\]|\((\w+)\)|:(\w+))\s*$")
_NOTE_DTYPE = re.compile(r"\bno (" + "|".join(_DTYPE_WORDS) + r")\b", re.IGNORECASE)


def gap_op_and_dtypes(gap: OpGap) -> tuple[str, frozenset[str] | None]:
    """The op an op_gaps entry names and the input dtypes it is limited to (None: every dtype).

    The matrix schema has only {op, note}, so a dtype is read from the op field ("Erf[float64]",
    "Erf(float64)", "Erf:float64") or else from the note's "no <dtype> ..." wording
    (ort-1.32: op Erf, note "no float64 CPU kernel: ...").
    """
    qualified = _QUALIFIED_OP.match(gap.op)
    if qualified:
        op, *dtypes = qualified.groups()
        return op, frozenset(d.lower() for d in dtypes if d)
    from_note = {m.lower() for m in _NOTE_DTYPE.findall(gap.note)}
    return gap.op.strip(), (frozenset(from_note) if from_note else None)


def gap_text(target: Target, gap: OpGap) -> str:
    source = cite(target, "op_gaps")
    note = _abbreviate(gap.note, _QUOTE_CHARS)
    return f"(op_gaps: {gap.op}: {note}; {source})" if source else f"(op_gaps: {gap.op}: {note})"


def names_text(nodes: list[str]) -> str:
    listed = ", ".join(shown(node) for node in nodes[:_SHOWN])
    more = len(nodes) - _SHOWN
    return f"{listed} and {more} more" if more > 0 else listed


def gelu_fix(kind: str) -> str | None:
    """What fixes a located incompatibility: exporting for the target writes each GELU in a form
    it runs (--gelu preserve); an op elsewhere, nothing."""
    return "" if kind == "gelu" else None


# ---- grouping -------------------------------------------------------------------------------------


class Hits:
    """Offending nodes grouped: one incompatibility per GELU site, else one per op and reason."""

    def __init__(self) -> None:
        self._groups: dict[tuple, dict[str, Any]] = {}

    def add(self, reason: str, op: str, node: str, site: Any | None, **extra: Any) -> None:
        key = (reason, op, site.site_id if site is not None else None, tuple(sorted(extra.items())))
        group = self._groups.setdefault(key, {"reason": reason, "op": op, "site": site, "nodes": [], **extra})
        if node not in group["nodes"]:
            group["nodes"].append(node)

    def groups(self) -> list[dict[str, Any]]:
        return list(self._groups.values())


def locate(group: dict[str, Any], what: str) -> tuple[str, str]:
    """(kind, 'GELU site 0:x uses ...' or 'what at node(s) ...')."""
    site = group["site"]
    if site is not None:
        nodes = group["nodes"]
        at = "" if list(site.nodes) == nodes else f" at node {names_text(nodes)}"
        kind_of_site = "" if site.op == group["op"] else f" ({site.op})"
        return "gelu", f"GELU site {shown(site.site_id)}{kind_of_site} uses {what}{at}"
    n = len(group["nodes"])
    return "op", f"{what} at {n} node{'s' if n != 1 else ''} ({names_text(group['nodes'])})"


def finding_detail(group: dict[str, Any], fact: str, target: Target, **more: Any) -> dict[str, Any]:
    site = group["site"]
    out = {"op": group["op"], "nodes": list(group["nodes"]), "fact": fact, "sources": fact_sources(target, fact)}
    if site is not None:
        out |= {"site": site.site_id, "site_op": site.op, "claimed": site.claimed}
    return out | more


# ---- ONNX ------------------------------------------------------------------------------------------

def dtype_incompatibilities(tensor_dtypes: dict[str, str], target: Target, what: str) -> list[Incompatibility]:
    allowed = set(target.dtypes or ())
    by_dtype: dict[str, list[str]] = defaultdict(list)
    for name, dtype in tensor_dtypes.items():
        if dtype not in allowed:
            by_dtype[dtype].append(name)
    out = []
    for dtype, names in sorted(by_dtype.items()):
        names = sorted(names)
        n = len(names)
        message = (f"{n} {what}{'s' if n != 1 else ''} of dtype {dtype} ({names_text(names)}); {target.name} "
                   f"supports {', '.join(target.dtypes or ())} ({cite(target, 'dtypes') or 'dtypes'})")
        out.append(Incompatibility("dtype", message, {
            "dtype": dtype, "tensors": names, "fact": "dtypes", "allowed": list(target.dtypes or ()),
            "sources": fact_sources(target, "dtypes")}))
    return out


def _padded(version: str, width: int) -> tuple[int, ...]:
    key = version_key(version)
    return key + (0,) * (width - len(key))


def version_greater(a: str, b: str) -> bool:
    """a > b numerically, missing parts as 0 ("2.9.0" > "2.8", "2.9.0" == "2.9", "2.10" > "2.9")."""
    width = max(len(a.split(".")), len(b.split(".")))
    return _padded(a, width) > _padded(b, width)

