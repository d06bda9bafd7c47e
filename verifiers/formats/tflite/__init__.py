"""TFLite artifacts: one .tflite flatbuffer, read and validated without TensorFlow or LiteRT.

The file is parsed once (verifiers.tflite_model checks every offset and index); the GELU sites
are measured by running each site's ops alone in LiteRT (verifiers.gelu); target checks read the
minimum runtime version, GELU builtins, SIGN, unfused tanh chains, custom and Flex ops, op gaps,
dtypes and the integer-device facts (verifiers.precision) against the matrix entry.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from verifiers.errors import BadInput
from verifiers.formats import Artifact, ArtifactFormat
from verifiers.formats.tflite.precision import (tflite_activation_shapes, tflite_dynamic_axes, tflite_input_ranges,
                                               tflite_precision)
from verifiers.precision import Precision, integer_device_incompatibilities
from verifiers.target_facts import (
    Hits,
    Incompatibility,
    delegate_of,
    dtype_incompatibilities,
    fact_sources,
    fact_text,
    finding_detail,
    gap_op_and_dtypes,
    gap_text,
    gelu_fix,
    locate,
    version_greater,
)
from verifiers.targets import RANK_FIELDS, OpGap, Target
from verifiers.tflite_model import (
    FILE_IDENTIFIER,
    MIN_RUNTIME_VERSION_KEY,
    TFLiteModel,
    computed_min_runtime_version,
    describe,
    load_tflite,
)
from verifiers.tflite_runtime_versions import RUNTIME_VERSIONS, version_key


# What writes a full-integer artifact for an integer-only target: an integer device takes int8 inputs and outputs.
INTEGER_FIX = "--quantize int8 --io int8"

class TfliteArtifact(Artifact):
    @cached_property
    def model(self) -> TFLiteModel:
        """The flatbuffer, read and validated once."""
        return load_tflite(self.path)

    def describe(self) -> dict[str, Any]:
        return describe(self.path, self.model)

    @property
    def generates_by_signatures(self) -> bool:
        from verifiers.runtimes.litert_lm import is_litert_lm

        return is_litert_lm([signature.key for signature in self.model.signatures])

    def record_facts(self, report) -> None:
        info = self.describe()
        report.min_runtime_version = info["min_runtime_version"]
        if info["min_runtime_version_source"] == "computed":
            report.notes.append(f"min_runtime_version {info['min_runtime_version']} computed from the op "
                                "versions (the file carries no metadata)")

    def activation_sites(self, runner: type | None = None) -> list:
        from verifiers.formats.tflite.gelu_inventory import tflite_inventory

        return tflite_inventory(self.model, runner)

    def precision(self) -> Precision:
        return tflite_precision(self.model, _tflite_labels(self.model)[0])

    def input_ranges(self) -> dict[str, tuple[float, float]]:
        return tflite_input_ranges(self.model)

    def int8_spec_violations(self) -> list:
        from verifiers.formats.tflite.int8_spec import int8_spec_violations

        return int8_spec_violations(self.model)

    def check_target(self, target: Target) -> list[Incompatibility]:
        return _check_tflite(self.model, target)


class TfliteFormat(ArtifactFormat):
    name = "tflite"
    title = "TFLite"
    article = "a"
    suffixes = (".tflite",)
    artifact_class = TfliteArtifact
    target_limit = "max_runtime_version"
    target_fields = RANK_FIELDS
    gelu_flags = ("builtin", "builtin_int8", "tanh_chain", "sign_op")

    def recognises(self, head: bytes) -> bool:
        return head[4:8] == FILE_IDENTIFIER

    def target_limits(self, raw: dict, fail: Callable[[str, str], BadInput]) -> dict[str, Any]:
        if self.target_limit not in raw:
            raise fail(self.target_limit, "is required (null when not sourced)")
        value = raw[self.target_limit]
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise fail(self.target_limit, "must be a non-empty string")
        return {"max_runtime_version": value}

    def limit_text(self, target: dict[str, Any]) -> str:
        return f"runtime {target['max_runtime_version'] or '(not sourced)'}"

    def headline(self, info: dict[str, Any]) -> list[str]:
        lines = [f"{info['path']}: tflite, schema {info['schema_version']}, min_runtime_version "
                 f"{info['min_runtime_version']} ({info['min_runtime_version_source']})"]
        signatures = [signature["key"] for signature in info.get("signatures", [])]
        if len(signatures) > 1:  # an LLM's prefill and decode: the inputs and outputs below are the first's
            lines.append(f"signatures: {', '.join(signatures)} (inputs and outputs of {signatures[0]})")
        return lines

    def localization_graph(self, path: Path) -> Any:
        from verifiers.formats.tflite.localization import TfliteGraph

        return TfliteGraph(path)

    def layer_errors(self, quantized: Path, float_model: Path | None, feeds: list[dict], runner_class: type) -> Any:
        from verifiers.formats.tflite.layers import tflite_layer_errors

        return tflite_layer_errors(quantized, float_model, feeds, runner_class)


# ---- target checks ---------------------------------------------------------------------------------


def _tflite_labels(model) -> tuple[list[list[str]], dict[tuple[int, int], Any]]:
    """Per subgraph, a label per op; and (subgraph, op) -> GELU site for subgraph 0."""
    from verifiers.formats.tflite.gelu_sites import SUBGRAPH, find_tflite_sites, read_graph

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


def _check_tflite(model: TFLiteModel, target: Target) -> list[Incompatibility]:
    out: list[Incompatibility] = []
    gelu = target.gelu
    delegate = delegate_of(target)
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
                       f"{target.name}'s {fact_text(target, 'max_runtime_version', target.max_runtime_version)}")
            out.append(Incompatibility("runtime_version", message, {
                "min_runtime_version": needed, "min_runtime_version_source": source,
                "min_runtime_version_metadata": stored, "min_runtime_version_computed": computed,
                "max_runtime_version": target.max_runtime_version, "ops": [list(o) for o in ops],
                "fact": "max_runtime_version", "sources": fact_sources(target, "max_runtime_version")},
                # an export for the target writes GELU in a form it runs: what only GELU needed goes
                fix="" if ops and {name for name, _ in ops} <= {"GELU"} else None))

    labels, site_of = _tflite_labels(model)
    gaps = [(gap, *gap_op_and_dtypes(gap)) for gap in target.op_gaps]
    hits = Hits()
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
        out.extend(dtype_incompatibilities(tensors, target, "tensor"))

    builtin_ops = [(oc.name, labels[g][op.index]) for g, sg in enumerate(model.subgraphs) for op in sg.operators
                   for oc in [model.opcode(op)] if not oc.custom]  # custom and Flex ops: flagged above
    out.extend(integer_device_incompatibilities(
        target, tflite_precision(model, labels) if target.integer_only else None, tflite_dynamic_axes(model),
        builtin_ops, INTEGER_FIX, tflite_activation_shapes(model)))
    return out


def _flex_base(name: str) -> str:
    return name.removeprefix("Flex")


def _tflite_incompatibility(group: dict[str, Any], target: Target, lacks: str) -> Incompatibility:
    reason, op = group["reason"], group["op"]
    if reason == "custom":
        flex = op.startswith("Flex")
        what = f"{'Flex' if flex else 'custom'} op {op}"
        _, where = locate(group, what)
        why = ("a TensorFlow kernel (SELECT_TF_OPS) that only runs with the Flex delegate linked in" if flex
               else "a custom op that only runs with its kernel registered in the interpreter")
        message = f"{where} is not a builtin: {why}, which no matrix target provides"
        gap: OpGap | None = group.get("gap")
        if gap is not None:
            message += f"; also {target.name} {gap_text(target, gap)}"
        return Incompatibility("op", message, finding_detail(group, "op_gaps" if gap else "custom_ops", target, custom=True,
                                                      flex=flex, gap={"op": gap.op, "note": gap.note} if gap else None))
    if reason == "gelu_builtin":
        flag, version = group["flag"], group["version"]
        kind_text = "float" if version < 2 else "int8/uint8"
        kind, where = locate(group, f"the GELU builtin (op version {version}, {kind_text})")
        return Incompatibility("gelu" if kind == "gelu" else "op",
                               f"{where}; {lacks} it {fact_text(target, f'gelu.{flag}', False)}",
                               finding_detail(group, f"gelu.{flag}", target, version=version), gelu_fix(kind))
    if reason == "sign":
        kind, where = locate(group, f"SIGN (op version {group['version']})")
        return Incompatibility(kind, f"{where}; {lacks} it {fact_text(target, 'gelu.sign_op', False)}",
                               finding_detail(group, "gelu.sign_op", target), gelu_fix(kind))
    if reason == "tanh_chain":
        kind, where = locate(group, "the tanh formula as MUL/ADD/TANH builtins")
        return Incompatibility(kind, f"{where}; {lacks} it {fact_text(target, 'gelu.tanh_chain', False)}",
                               finding_detail(group, "gelu.tanh_chain", target), gelu_fix(kind))
    gap = group["gap"]
    dtype = group.get("dtype")
    kind, where = locate(group, f"{op} on {dtype} input" if dtype else op)
    return Incompatibility(kind, f"{where}; {lacks} it {gap_text(target, gap)}",
                           finding_detail(group, "op_gaps", target, gap={"op": gap.op, "note": gap.note}, dtype=dtype),
                           gelu_fix(kind))
