"""`exportgate check ARTIFACT --target NAME`: what in an artifact a target runtime or device lacks.

`check_artifact(path, target)` reads an .onnx or .tflite file (structure only: nothing runs, no
TensorFlow or torch is imported) and returns every incompatibility with the target's entry in
opset_matrix.yaml (exporter/targets.py), not only the first. Each one names what is wrong, where
(GELU site id, node or op) and the matrix fact it breaks with its source, abbreviated. A matrix
value of None claims nothing, so it never makes an incompatibility, with one exception the
matrix states in its header: com.microsoft ops are ONNX Runtime contrib ops, so a target whose
runtime is not ONNX Runtime cannot run them whatever its (unsourced) contrib_gelu says.

ONNX: format, default-domain opset > max_opset, Gelu (gelu.gelu_op), Erf (gelu.erf),
com.microsoft ops (gelu.contrib_gelu, runtime), op_gaps (an optional dtype: "Erf[float64]" in
the op field, or "no float64 ..." in the note, checked against the op's input types) and tensor
dtypes outside `dtypes`. TFLite: format, min_runtime_version (metadata or computed, the higher)
> max_runtime_version, GELU builtin (gelu.builtin for op version 1, gelu.builtin_int8 for 2),
SIGN (gelu.sign_op), an unfused tanh chain (gelu.tanh_chain), custom and Flex ops (always),
op_gaps and dtypes.

`to_findings` turns them into report Findings: kind "opset" for an opset above the target's,
"target" for everything else (both exit 4).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from exporter.targets import OpGap, Target
from verifiers.formats import detect_format
from verifiers.onnx_model import (
    malformed_onnx_is_bad_input,
    DEFAULT_DOMAINS,
    default_opset,
    elem_types,
    iter_nodes,
    load_structure,
)
from verifiers.report import Finding
from verifiers.tflite_model import (
    MIN_RUNTIME_VERSION_KEY,
    RUNTIME_VERSIONS,
    computed_min_runtime_version,
    load_tflite,
    version_key,
)

KINDS = ("opset", "ir_version", "op", "dtype", "gelu", "runtime_version", "format")
MS_DOMAIN = "com.microsoft"
CONTRIB_GELU_OPS = ("Gelu", "FastGelu", "BiasGelu", "QuickGelu")
FORMAT_NAMES = {"onnx": "ONNX", "tflite": "TFLite"}
_ARTICLE = {"onnx": "an", "tflite": "a"}
_SHOWN = 3  # node names listed in a message before "and N more"
_QUOTE_CHARS = 60


@dataclass(frozen=True)
class Incompatibility:
    """One thing in the artifact the target lacks.

    kind: "opset" | "op" | "dtype" | "gelu" | "runtime_version" | "format"; message: one line
    (what, where, the matrix fact and its source); detail: machine-readable facts (site, nodes,
    op, fact key, target value, sources...).
    """

    kind: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown incompatibility kind {self.kind!r}")


def check_artifact(path: str | Path, target: Target) -> list[Incompatibility]:
    """Every incompatibility of the artifact at `path` with `target` (empty: compatible as far as
    the matrix says). Unreadable files raise BadInput."""
    path = Path(path)
    fmt = detect_format(path)
    if fmt != target.format:
        return [Incompatibility("format", (
            f"{path.name} is {_ARTICLE[fmt]} {FORMAT_NAMES[fmt]} artifact; {target.name} takes {FORMAT_NAMES[target.format]} "
            f"artifacts (matrix format: {target.format})"
        ), {"artifact_format": fmt, "target_format": target.format, "fact": "format"})]
    if fmt == "onnx":
        return malformed_onnx_is_bad_input(path, _check_onnx, path, target)
    return _check_tflite(path, target)


def to_findings(incompatibilities: list[Incompatibility]) -> list[Finding]:
    """Report findings: "opset" for the opset, "target" for everything else (both exit 4)."""
    return [
        Finding(
            kind="opset" if inc.kind == "opset" else "target",
            message=inc.message,
            site=inc.detail.get("site"),
            data={"incompatibility": inc.kind, **inc.detail},
        )
        for inc in incompatibilities
    ]


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


def _sources(target: Target, fact: str) -> list[dict[str, str]]:
    return [{"source": s.source, "quote": s.quote} for s in target.sources if s.fact == fact]


def _fact(target: Target, fact: str, value: Any) -> str:
    """'(fact: value; source: ...)'."""
    shown = str(value).lower() if isinstance(value, bool) else value
    source = cite(target, fact)
    return f"({fact}: {shown}; {source})" if source else f"({fact}: {shown})"


def _is_onnxruntime(target: Target) -> bool:
    return target.runtime.lower().startswith("onnxruntime")


def _delegate(target: Target) -> str | None:
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


def _gap_text(target: Target, gap: OpGap) -> str:
    source = cite(target, "op_gaps")
    note = _abbreviate(gap.note, _QUOTE_CHARS)
    return f"(op_gaps: {gap.op}: {note}; {source})" if source else f"(op_gaps: {gap.op}: {note})"


def _nodes_text(nodes: list[str]) -> str:
    shown = ", ".join(nodes[:_SHOWN])
    more = len(nodes) - _SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


# ---- grouping -------------------------------------------------------------------------------------


class _Hits:
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


def _where(group: dict[str, Any], what: str) -> tuple[str, str]:
    """(kind, 'GELU site 0:x uses ...' or 'what at node(s) ...')."""
    site = group["site"]
    if site is not None:
        nodes = group["nodes"]
        at = "" if list(site.nodes) == nodes else f" at node {_nodes_text(nodes)}"
        kind_of_site = "" if site.op == group["op"] else f" ({site.op})"
        return "gelu", f"GELU site {site.site_id}{kind_of_site} uses {what}{at}"
    n = len(group["nodes"])
    return "op", f"{what} at {n} node{'s' if n != 1 else ''} ({_nodes_text(group['nodes'])})"


def _detail(group: dict[str, Any], fact: str, target: Target, **more: Any) -> dict[str, Any]:
    site = group["site"]
    out = {"op": group["op"], "nodes": list(group["nodes"]), "fact": fact, "sources": _sources(target, fact)}
    if site is not None:
        out |= {"site": site.site_id, "site_op": site.op, "claimed": site.claimed}
    return out | more


# ---- ONNX ------------------------------------------------------------------------------------------

_ONNX_DTYPE_NAMES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT16: "uint16", onnx.TensorProto.INT16: "int16", onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.INT32: "int32", onnx.TensorProto.UINT64: "uint64", onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.BOOL: "bool", onnx.TensorProto.STRING: "string", onnx.TensorProto.COMPLEX64: "complex64",
    onnx.TensorProto.COMPLEX128: "complex128",
}
for _name in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0"):
    if hasattr(onnx.TensorProto, _name):
        _ONNX_DTYPE_NAMES[getattr(onnx.TensorProto, _name)] = "fp8"
for _name, _dtype in (("FLOAT4E2M1", "fp4"), ("INT4", "int4"), ("UINT4", "uint4"), ("INT2", "int2"), ("UINT2", "uint2")):
    if hasattr(onnx.TensorProto, _name):
        _ONNX_DTYPE_NAMES[getattr(onnx.TensorProto, _name)] = _dtype


def onnx_dtype_name(elem_type: int) -> str:
    """TensorProto element type -> the matrix's dtype vocabulary (float32, fp8, int4...)."""
    if elem_type in _ONNX_DTYPE_NAMES:
        return _ONNX_DTYPE_NAMES[elem_type]
    return onnx.TensorProto.DataType.Name(elem_type).lower()


def _node_label(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else node.op_type)


def _onnx_op(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _onnx_sites(model: onnx.ModelProto) -> dict[str, Any]:
    """node label -> GELU site (top-level graph); empty when the matcher cannot read the graph."""
    from verifiers.gelu.onnx_sites import find_gelu_sites

    try:
        sites = find_gelu_sites(model)
    except Exception:  # noqa: BLE001 - site ids only decorate messages; the checks stand without them
        return {}
    return {label: site for site in sites for label in site.nodes}


def _check_onnx(path: Path, target: Target) -> list[Incompatibility]:
    model = load_structure(path)
    out: list[Incompatibility] = []

    opset = default_opset(model)
    if opset is not None and target.max_opset is not None and opset > target.max_opset:
        out.append(Incompatibility("opset", (
            f"model opset {opset} (ai.onnx) is above {target.name}'s "
            f"{_fact(target, 'max_opset', target.max_opset)}"
        ), {"opset": opset, "max_opset": target.max_opset, "fact": "max_opset",
            "sources": _sources(target, "max_opset")}))
    if target.max_ir_version is not None and model.ir_version > target.max_ir_version:
        out.append(Incompatibility("ir_version", (
            f"model IR version {model.ir_version} is above {target.name}'s "
            f"{_fact(target, 'max_ir_version', target.max_ir_version)}"
        ), {"ir_version": model.ir_version, "max_ir_version": target.max_ir_version, "fact": "max_ir_version",
            "sources": _sources(target, "max_ir_version")}))

    nodes = list(iter_nodes(model.graph))
    site_of = _onnx_sites(model)
    gaps = [(gap, *gap_op_and_dtypes(gap)) for gap in target.op_gaps]
    needs_types = bool(target.dtypes) or any(dtypes for _, _, dtypes in gaps)
    types: dict[str, int] = {}
    if needs_types:
        names = {t for n in nodes for t in (*n.input, *n.output) if t}
        names |= {v.name for v in (*model.graph.input, *model.graph.output)}
        names |= {t.name for t in model.graph.initializer}
        types = elem_types(model, names)

    gelu = target.gelu
    ort = _is_onnxruntime(target)
    hits = _Hits()
    for node in nodes:
        label, op = _node_label(node), _onnx_op(node)
        site = site_of.get(label)
        if node.domain in DEFAULT_DOMAINS:
            if node.op_type == "Gelu" and gelu.get("gelu_op") is False:
                hits.add("gelu_op", op, label, site, approximate=_attr(node, "approximate", "none"))
            if node.op_type == "Erf" and gelu.get("erf") is False:
                hits.add("erf", op, label, site)
        elif node.domain == MS_DOMAIN:
            contrib = gelu.get("contrib_gelu")
            if contrib is False:
                hits.add("contrib_gelu", op, label, site)
            elif not ort and not (contrib is True and node.op_type in CONTRIB_GELU_OPS):
                hits.add("contrib_runtime", op, label, site)
        for gap, gap_op, dtypes in gaps:
            if gap_op != op:
                continue
            if dtypes is None:
                hits.add("op_gap", op, label, site, gap=gap)
                continue
            found = sorted({onnx_dtype_name(types[t]) for t in node.input if t in types} & dtypes)
            for dtype in found:
                hits.add("op_gap", op, label, site, gap=gap, dtype=dtype)

    for group in hits.groups():
        out.append(_onnx_incompatibility(group, target, opset))

    if target.dtypes:
        out.extend(_dtype_incompatibilities(
            {name: onnx_dtype_name(t) for name, t in types.items()}, target, "tensor"))
    return out


def _onnx_incompatibility(group: dict[str, Any], target: Target, opset: int | None) -> Incompatibility:
    reason, op = group["reason"], group["op"]
    if reason == "gelu_op":
        what = f"Gelu (opset {opset}, approximate='{group['approximate']}')"
        kind, where = _where(group, what)
        message = f"{where}; {target.name} has no Gelu-20 {_fact(target, 'gelu.gelu_op', False)}"
        return Incompatibility("gelu" if kind == "gelu" else "op", message,
                               _detail(group, "gelu.gelu_op", target, approximate=group["approximate"]))
    if reason == "erf":
        kind, where = _where(group, "Erf")
        return Incompatibility(kind, f"{where}; {target.name} has no Erf {_fact(target, 'gelu.erf', False)}",
                               _detail(group, "gelu.erf", target))
    if reason == "contrib_gelu":
        kind, where = _where(group, op)
        message = (f"{where}; {target.name} has no com.microsoft (ONNX Runtime contrib) kernels "
                   f"{_fact(target, 'gelu.contrib_gelu', False)}")
        return Incompatibility(kind, message, _detail(group, "gelu.contrib_gelu", target))
    if reason == "contrib_runtime":
        kind, where = _where(group, op)
        message = (f"{where}; com.microsoft ops are ONNX Runtime contrib ops and {target.name} is not ONNX "
                   f"Runtime (matrix runtime: {target.runtime})")
        return Incompatibility(kind, message, _detail(group, "runtime", target, runtime=target.runtime,
                                                       contrib_gelu=target.gelu.get("contrib_gelu")))
    # op_gap
    gap: OpGap = group["gap"]
    dtype = group.get("dtype")
    what = f"{op} on {dtype} input" if dtype else op
    kind, where = _where(group, what)
    return Incompatibility(kind, f"{where}; {target.name} lacks it {_gap_text(target, gap)}",
                           _detail(group, "op_gaps", target, gap={"op": gap.op, "note": gap.note}, dtype=dtype))


def _dtype_incompatibilities(tensor_dtypes: dict[str, str], target: Target, what: str) -> list[Incompatibility]:
    allowed = set(target.dtypes or ())
    by_dtype: dict[str, list[str]] = defaultdict(list)
    for name, dtype in tensor_dtypes.items():
        if dtype not in allowed:
            by_dtype[dtype].append(name)
    out = []
    for dtype, names in sorted(by_dtype.items()):
        names = sorted(names)
        n = len(names)
        message = (f"{n} {what}{'s' if n != 1 else ''} of dtype {dtype} ({_nodes_text(names)}); {target.name} "
                   f"supports {', '.join(target.dtypes or ())} ({cite(target, 'dtypes') or 'dtypes'})")
        out.append(Incompatibility("dtype", message, {
            "dtype": dtype, "tensors": names, "fact": "dtypes", "allowed": list(target.dtypes or ()),
            "sources": _sources(target, "dtypes")}))
    return out


# ---- TFLite ----------------------------------------------------------------------------------------


def _padded(version: str, width: int) -> tuple[int, ...]:
    key = version_key(version)
    return key + (0,) * (width - len(key))


def version_greater(a: str, b: str) -> bool:
    """a > b numerically, missing parts as 0 ("2.9.0" > "2.8", "2.9.0" == "2.9", "2.10" > "2.9")."""
    width = max(len(a.split(".")), len(b.split(".")))
    return _padded(a, width) > _padded(b, width)


def _tflite_labels(model) -> tuple[list[list[str]], dict[tuple[int, int], Any]]:
    """Per subgraph, a label per op; and (subgraph, op) -> GELU site for subgraph 0."""
    from verifiers.gelu.tflite_sites import SUBGRAPH, find_tflite_sites, read_graph

    labels = [[f"subgraph {g} op {i}" for i in range(len(sg.operators))] for g, sg in enumerate(model.subgraphs)]
    site_of: dict[tuple[int, int], Any] = {}
    try:
        graph = read_graph(model)
        sites = find_tflite_sites(model)
    except Exception:  # noqa: BLE001 - site ids only decorate messages; the checks stand without them
        return labels, site_of
    labels[SUBGRAPH] = list(graph.op_labels)
    for site in sites:
        for label in site.nodes:
            site_of[(SUBGRAPH, graph.op_index(label))] = site
    return labels, site_of


def _check_tflite(path: Path, target: Target) -> list[Incompatibility]:
    model = load_tflite(path)
    out: list[Incompatibility] = []
    gelu = target.gelu
    delegate = _delegate(target)
    lacks = f"the {delegate} delegate of {target.name} does not take" if delegate else f"{target.name} lacks"

    stored = model.metadata_text(MIN_RUNTIME_VERSION_KEY)
    computed = computed_min_runtime_version(model)
    candidates = [(v, src) for v, src in ((stored, "metadata"), (computed, "computed")) if v]
    if candidates and target.max_runtime_version is not None:
        needed, source = max(candidates, key=lambda c: version_key(c[0]))
        if version_greater(needed, target.max_runtime_version):
            ops = sorted({(oc.name, oc.version) for sg in model.subgraphs for oc in map(model.opcode, sg.operators)
                          if (oc.name, oc.version) in RUNTIME_VERSIONS
                          and version_greater(RUNTIME_VERSIONS[(oc.name, oc.version)], target.max_runtime_version)})
            needs = ", ".join(f"{name} v{v} needs {RUNTIME_VERSIONS[(name, v)]}" for name, v in ops)
            message = (f"min_runtime_version {needed} ({source}{'; ' + needs if needs else ''}) is above "
                       f"{target.name}'s {_fact(target, 'max_runtime_version', target.max_runtime_version)}")
            out.append(Incompatibility("runtime_version", message, {
                "min_runtime_version": needed, "min_runtime_version_source": source,
                "min_runtime_version_metadata": stored, "min_runtime_version_computed": computed,
                "max_runtime_version": target.max_runtime_version, "ops": [list(o) for o in ops],
                "fact": "max_runtime_version", "sources": _sources(target, "max_runtime_version")}))

    labels, site_of = _tflite_labels(model)
    gaps = [(gap, *gap_op_and_dtypes(gap)) for gap in target.op_gaps]
    hits = _Hits()
    for g, sg in enumerate(model.subgraphs):
        for op in sg.operators:
            oc = model.opcode(op)
            label, site = labels[g][op.index], site_of.get((g, op.index))
            if oc.custom:
                matched = [gap for gap, gap_op, _ in gaps if gap_op.upper() == _flex_base(oc.name).upper()]
                hits.add("custom", oc.name, label, None, gap=matched[0] if matched else None)
                continue
            if oc.name == "GELU":
                flag = "builtin" if oc.version < 2 else "builtin_int8"
                if gelu.get(flag) is False:
                    hits.add("gelu_builtin", oc.name, label, site, flag=flag, version=oc.version)
            if oc.name == "SIGN" and gelu.get("sign_op") is False:
                hits.add("sign", oc.name, label, site, version=oc.version)
            if site is not None and site.op == "tanh-chain" and gelu.get("tanh_chain") is False:
                hits.add("tanh_chain", "tanh-chain", label, site)
            for gap, gap_op, dtypes in gaps:
                if gap_op.upper() != oc.name.upper():
                    continue
                if dtypes is None:
                    hits.add("op_gap", oc.name, label, site, gap=gap)
                    continue
                found = sorted({sg.tensors[t].dtype for t in op.inputs if t >= 0} & dtypes)
                for dtype in found:
                    hits.add("op_gap", oc.name, label, site, gap=gap, dtype=dtype)

    for group in hits.groups():
        out.append(_tflite_incompatibility(group, target, lacks))

    if target.dtypes:
        tensors = {f"{t.name or f'#{i}'}" + (f" (subgraph {g})" if g else ""): t.dtype
                   for g, sg in enumerate(model.subgraphs) for i, t in enumerate(sg.tensors)}
        out.extend(_dtype_incompatibilities(tensors, target, "tensor"))
    return out


def _flex_base(name: str) -> str:
    return name.removeprefix("Flex")


def _tflite_incompatibility(group: dict[str, Any], target: Target, lacks: str) -> Incompatibility:
    reason, op = group["reason"], group["op"]
    if reason == "custom":
        flex = op.startswith("Flex")
        what = f"{'Flex' if flex else 'custom'} op {op}"
        _, where = _where(group, what)
        why = ("a TensorFlow kernel (SELECT_TF_OPS) that only runs with the Flex delegate linked in" if flex
               else "a custom op that only runs with its kernel registered in the interpreter")
        message = f"{where} is not a builtin: {why}, which no matrix target provides"
        gap: OpGap | None = group.get("gap")
        if gap is not None:
            message += f"; also {target.name} {_gap_text(target, gap)}"
        return Incompatibility("op", message, _detail(group, "op_gaps" if gap else "custom_ops", target, custom=True,
                                                      flex=flex, gap={"op": gap.op, "note": gap.note} if gap else None))
    if reason == "gelu_builtin":
        flag, version = group["flag"], group["version"]
        kind_text = "float" if version < 2 else "int8/uint8"
        kind, where = _where(group, f"the GELU builtin (op version {version}, {kind_text})")
        return Incompatibility("gelu" if kind == "gelu" else "op",
                               f"{where}; {lacks} it {_fact(target, f'gelu.{flag}', False)}",
                               _detail(group, f"gelu.{flag}", target, version=version))
    if reason == "sign":
        kind, where = _where(group, f"SIGN (op version {group['version']})")
        return Incompatibility(kind, f"{where}; {lacks} it {_fact(target, 'gelu.sign_op', False)}",
                               _detail(group, "gelu.sign_op", target))
    if reason == "tanh_chain":
        kind, where = _where(group, "the tanh formula as MUL/ADD/TANH builtins")
        return Incompatibility(kind, f"{where}; {lacks} it {_fact(target, 'gelu.tanh_chain', False)}",
                               _detail(group, "gelu.tanh_chain", target))
    gap = group["gap"]
    dtype = group.get("dtype")
    kind, where = _where(group, f"{op} on {dtype} input" if dtype else op)
    return Incompatibility(kind, f"{where}; {lacks} it {_gap_text(target, gap)}",
                           _detail(group, "op_gaps", target, gap={"op": gap.op, "note": gap.note}, dtype=dtype))
