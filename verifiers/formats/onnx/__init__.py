"""ONNX artifacts: a .onnx file (and its external data files), read with onnx without running it.

The structure is parsed once, without the external weights; the GELU sites are measured by
running each site's subgraph alone (verifiers.gelu); target checks read the opset, the IR version,
the GELU spellings, com.microsoft ops, op gaps, dtypes and the integer-device facts
(verifiers.precision) against the matrix entry.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import onnx

from verifiers.errors import BadInput
from verifiers.formats import Artifact, ArtifactFormat
from verifiers.gelu.catalogue import FLAVOURS, ONNX
from verifiers.onnx_model import (
    DEFAULT_DOMAINS,
    default_opset,
    describe,
    elem_types,
    iter_nodes,
    load_structure,
    malformed_onnx_is_bad_input,
    node_attrs,
    node_label,
    onnx_dtype_name,
    op_name,
    relocate_external_data,
    Structure,
)
from verifiers.formats.onnx.precision import onnx_dynamic_axes, onnx_input_ranges, onnx_node_labels, onnx_precision
from verifiers.precision import Precision, integer_device_incompatibilities
from verifiers.target_facts import (
    Hits,
    Incompatibility,
    dtype_incompatibilities,
    fact_sources,
    fact_text,
    finding_detail,
    gap_op_and_dtypes,
    gap_text,
    gelu_fix,
    is_onnxruntime,
    locate,
)
from verifiers.targets import OpGap, Target

MS_DOMAIN = "com.microsoft"
# What writes a full-integer artifact for an integer-only target: a QDQ model keeps float inputs and outputs.
INTEGER_FIX = "--quantize int8"
# The com.microsoft ops a contrib_gelu: true target runs: those the catalogue says claim a GELU flavour.
CONTRIB_GELU_OPS = tuple(claim.op.removeprefix(f"{MS_DOMAIN}.") for f in FLAVOURS.values() for claim in f.claims
                         if claim.framework == ONNX and claim.op.startswith(f"{MS_DOMAIN}."))


class OnnxArtifact(Artifact):
    gelu_rewritable = True

    @cached_property
    def structure(self) -> Structure:
        """The graph without its weights, read once; external data locations are checked."""
        return load_structure(self.path)

    @property
    def model(self) -> onnx.ModelProto:
        return self.structure.model

    def companion_files(self) -> list[str]:
        return self.structure.external_data_files() if self.path.exists() else []

    def relocate_companions(self, old_to_new: dict[str, str]) -> None:
        relocate_external_data(self.path, old_to_new)
        self.__dict__.pop("structure", None)

    def describe(self) -> dict[str, Any]:
        return malformed_onnx_is_bad_input(self.path, describe, self.path, self.structure)

    def record_facts(self, report) -> None:
        report.actual_opset = default_opset(self.model)
        if report.requested_opset is not None and report.actual_opset != report.requested_opset:
            report.fail("opset", f"asked for opset {report.requested_opset}, the artifact has opset "
                                 f"{report.actual_opset} ({report.exporter})")

    def shape_constants(self) -> list[tuple[str, str, list[int]]]:
        from verifiers.onnx_model import constant_shapes

        return malformed_onnx_is_bad_input(self.path, constant_shapes, self.model)

    def activation_sites(self, runner: type | None = None) -> list:
        from verifiers.formats.onnx.gelu_inventory import onnx_inventory

        return malformed_onnx_is_bad_input(self.path, onnx_inventory, self.model, runner)

    def precision(self) -> Precision:
        return malformed_onnx_is_bad_input(self.path, onnx_precision, self.model)

    def input_ranges(self) -> dict[str, tuple[float, float]]:
        return malformed_onnx_is_bad_input(self.path, onnx_input_ranges, self.model)

    def check_target(self, target: Target) -> list[Incompatibility]:
        return malformed_onnx_is_bad_input(self.path, _check_onnx, self.model, target)

    def gelu_swapped(self, sites: list) -> bytes | None:
        """The variant's graph; its weights stay where the artifact's lie (its data files, or the
        artifact file itself, at the offsets the structure marks), for the runtime to read."""
        from verifiers.formats.onnx.gelu_normalize import split_duplicate_gemms
        from verifiers.formats.onnx.gelu_sensitivity import swapped_variant

        variant = swapped_variant(split_duplicate_gemms(self.model), sites)
        return None if variant is None else variant.SerializeToString()


class OnnxFormat(ArtifactFormat):
    name = "onnx"
    title = "ONNX"
    article = "an"
    suffixes = (".onnx",)
    artifact_class = OnnxArtifact
    target_limit = "max_opset"
    target_fields = ("max_ir_version",)
    gelu_flags = ("gelu_op", "erf", "contrib_gelu")

    def recognises(self, head: bytes) -> bool:
        return head[:1] == b"\x08"  # protobuf field 1 (ir_version), varint: how every ONNX file starts

    def target_limits(self, raw: dict, fail: Callable[[str, str], BadInput]) -> dict[str, Any]:
        max_opset = raw.get("max_opset")
        if isinstance(max_opset, bool) or not isinstance(max_opset, int):
            raise fail("max_opset", "must be an integer")
        if max_opset < 1:
            raise fail("max_opset", "must be positive")
        max_ir_version = raw.get("max_ir_version")
        if max_ir_version is not None and (isinstance(max_ir_version, bool) or not isinstance(max_ir_version, int)
                                           or max_ir_version < 1):
            raise fail("max_ir_version", "must be a positive integer or null")
        return {"max_opset": max_opset, "max_ir_version": max_ir_version}

    def limit_text(self, target: dict[str, Any]) -> str:
        return f"opset <= {target['max_opset']}"

    def headline(self, info: dict[str, Any]) -> list[str]:
        return [f"{info['path']}: onnx, opset {info['opset']}, producer {info['producer'] or '?'}",
                "opset imports: " + ", ".join(f"{d} {v}" for d, v in info["opset_imports"].items())]

    def localization_graph(self, path: Path) -> Any:
        from verifiers.formats.onnx.localization import OnnxGraph

        return OnnxGraph(path)

    def layer_errors(self, quantized: Path, float_model: Path | None, feeds: list[dict], runner_class: type) -> Any:
        from verifiers.formats.onnx.layers import onnx_layer_errors

        return onnx_layer_errors(quantized, float_model, feeds, runner_class)

    def variant_model(self, path: Path, variant: str, folder: Path) -> Path:
        if variant != "float16":
            return super().variant_model(path, variant, folder)
        from verifiers.onnx_float16 import emulated

        written = folder / f"{path.stem}.float16-emulated.onnx"
        onnx.save(emulated(onnx.load(str(path))), str(written))
        return written


# ---- target checks ---------------------------------------------------------------------------------


def _onnx_sites(model: onnx.ModelProto) -> dict[str, Any]:
    """node label -> GELU site (top-level graph); empty when the matcher cannot read the graph."""
    from verifiers.formats.onnx.gelu_sites import find_gelu_sites

    try:
        sites = find_gelu_sites(model)
    except Exception:  # noqa: BLE001 - site ids only decorate messages; the checks stand without them
        return {}
    return {label: site for site in sites for label in site.nodes}


def _check_onnx(model: onnx.ModelProto, target: Target) -> list[Incompatibility]:
    out: list[Incompatibility] = []

    opset = default_opset(model)
    if opset is not None and target.max_opset is not None and opset > target.max_opset:
        out.append(Incompatibility("opset", (
            f"model opset {opset} (ai.onnx) is above {target.name}'s "
            f"{fact_text(target, 'max_opset', target.max_opset)}"
        ), {"opset": opset, "max_opset": target.max_opset, "fact": "max_opset",
            "sources": fact_sources(target, "max_opset")}, fix=""))
    if target.max_ir_version is not None and model.ir_version > target.max_ir_version:
        out.append(Incompatibility("ir_version", (
            f"model IR version {model.ir_version} is above {target.name}'s "
            f"{fact_text(target, 'max_ir_version', target.max_ir_version)}"
        ), {"ir_version": model.ir_version, "max_ir_version": target.max_ir_version, "fact": "max_ir_version",
            "sources": fact_sources(target, "max_ir_version")}, fix=""))

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
    ort = is_onnxruntime(target)
    hits = Hits()
    for node in nodes:
        label, op = node_label(node), op_name(node)
        site = site_of.get(label)
        if node.domain in DEFAULT_DOMAINS:
            if node.op_type == "Gelu" and gelu.get("gelu_op") is False:
                hits.add("gelu_op", op, label, site, approximate=node_attrs(node).get("approximate", "none"))
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
        out.extend(dtype_incompatibilities(
            {name: onnx_dtype_name(t) for name, t in types.items()}, target, "tensor"))
    out.extend(integer_device_incompatibilities(
        target, onnx_precision(model) if target.integer_only else None, onnx_dynamic_axes(model),
        [(op_name(node), label) for node, label in onnx_node_labels(model)], INTEGER_FIX))
    return out


def _onnx_incompatibility(group: dict[str, Any], target: Target, opset: int | None) -> Incompatibility:
    reason, op = group["reason"], group["op"]
    if reason == "gelu_op":
        what = f"Gelu (opset {opset}, approximate='{group['approximate']}')"
        kind, where = locate(group, what)
        message = f"{where}; {target.name} has no Gelu-20 {fact_text(target, 'gelu.gelu_op', False)}"
        return Incompatibility("gelu" if kind == "gelu" else "op", message,
                               finding_detail(group, "gelu.gelu_op", target, approximate=group["approximate"]),
                               gelu_fix(kind))
    if reason == "erf":
        kind, where = locate(group, "Erf")
        return Incompatibility(kind, f"{where}; {target.name} has no Erf {fact_text(target, 'gelu.erf', False)}",
                               finding_detail(group, "gelu.erf", target), gelu_fix(kind))
    if reason == "contrib_gelu":
        kind, where = locate(group, op)
        message = (f"{where}; {target.name} has no com.microsoft (ONNX Runtime contrib) kernels "
                   f"{fact_text(target, 'gelu.contrib_gelu', False)}")
        return Incompatibility(kind, message, finding_detail(group, "gelu.contrib_gelu", target), gelu_fix(kind))
    if reason == "contrib_runtime":
        kind, where = locate(group, op)
        message = (f"{where}; com.microsoft ops are ONNX Runtime contrib ops and {target.name} is not ONNX "
                   f"Runtime (matrix runtime: {target.runtime})")
        return Incompatibility(kind, message, finding_detail(group, "runtime", target, runtime=target.runtime,
                                                       contrib_gelu=target.gelu.get("contrib_gelu")), gelu_fix(kind))
    # op_gap
    gap: OpGap = group["gap"]
    dtype = group.get("dtype")
    what = f"{op} on {dtype} input" if dtype else op
    kind, where = locate(group, what)
    return Incompatibility(kind, f"{where}; {target.name} lacks it {gap_text(target, gap)}",
                           finding_detail(group, "op_gaps", target, gap={"op": gap.op, "note": gap.note}, dtype=dtype),
                           gelu_fix(kind))
