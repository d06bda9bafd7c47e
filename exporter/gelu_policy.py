"""--gelu policies: GELU written in the form a target runs.

preserve (default)  keep each GELU's flavour, in the fastest form the target runs: ONNX targets with
                    Gelu-20 get one Gelu node per site (chains of certain flavour fused back); targets
                    without Erf get exact GELU as an Erf-free polynomial; TFLite targets without the
                    GELU builtin (or older than the runtime version it needs) get MUL/ADD/TANH chains
                    and a SIGN-free erf polynomial. Without --target the artifact stays as exported.
tanh                write every GELU as the tanh approximation: an explicit change of flavour, which
                    the GELU guard lists as declared instead of failing.
native              demand the native GELU op; exit 4 where the target has none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from verifiers.errors import BadInput, Incompatible
from verifiers.gelu.catalogue import FLAVOURS, GELU, PRIMITIVES, TANH, TFLITE, UNCATALOGUED, claim_for

if TYPE_CHECKING:
    from verifiers.targets import Target

POLICIES = ("preserve", "tanh", "native")
# --gelu tanh: every GELU-family flavour and every uncatalogued GELU-shaped curve becomes tanh, as declared.
TANH_DECLARED = {f.name: TANH for f in FLAVOURS.values() if f.family in (GELU, UNCATALOGUED) and f.name != TANH}
# What --gelu tanh sets the TFLite GELU builtin's approximate flag to.
_TFLITE_TANH_FLAG = claim_for(TANH, TFLITE, "GELU").attr("approximate")
# The TFLite runtime version the GELU builtin needs (runtime_version.cc; the converter stamps it).
TFLITE_GELU_RUNTIME = "2.9.0"


@dataclass
class PolicyOutcome:
    notes: list[str] = field(default_factory=list)
    declared: dict[str, str] = field(default_factory=dict)  # source flavour -> flavour asked for


def check_gelu_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise BadInput(f"--gelu {policy!r}: choose one of {', '.join(POLICIES)}")


def apply_gelu_policy(path: Path, fmt: str, policy: str, target: Target | None) -> PolicyOutcome:
    """Rewrite the artifact at `path` in place as the policy and target require."""
    check_gelu_policy(policy)
    return FORMAT_POLICIES[fmt](Path(path), policy, target)


def _onnx(path: Path, policy: str, target: Target | None) -> PolicyOutcome:
    outcome = PolicyOutcome()
    if policy == "preserve" and target is None:
        return outcome  # the artifact stays as exported: nothing to read
    import onnx

    from exporter.rewrites import (
        ERF_FREE,
        GELU_OP,
        decompose_gelu_ops,
        fuse_gelu_chains,
        replace_site,
    )
    from verifiers.formats.onnx.gelu_sites import find_gelu_sites
    from verifiers.onnx_model import default_opset, load_structure

    opset = default_opset(load_structure(path).model) or 0
    where = f"{target.name}" if target else "the artifact"
    gelu_op = opset >= 20 and (target is None or target.gelu.get("gelu_op") is not False)
    erf = target is None or target.gelu.get("erf") is not False
    if policy == "native" and not gelu_op:
        if opset < 20:
            runs = f"; {target.name} loads opsets up to {target.max_opset}" if target else ""
            raise Incompatible(f"--gelu native: opset {opset} has no Gelu op; it is in the default domain from "
                               f"opset 20 (--opset 20){runs}", kind="opset")
        raise Incompatible(f"--gelu native: {where} does not run the Gelu op (opset 20) by the target matrix")
    model = onnx.load(str(path))
    rewritten = model
    if policy == "tanh":
        form = GELU_OP if gelu_op else PRIMITIVES
        changed = [s for s in find_gelu_sites(model) if s.claimed != TANH]
        for site in changed:
            rewritten = replace_site(rewritten, site, TANH, form=form)
        outcome.declared = dict(TANH_DECLARED)
        outcome.notes.append(f"--gelu tanh: {len(changed)} GELU site(s) written as tanh (declared)")
    elif gelu_op and (target is not None or policy == "native"):
        rewritten = fuse_gelu_chains(model)
        chains = sum(s.op != "Gelu" for s in find_gelu_sites(model)) - sum(
            s.op != "Gelu" for s in find_gelu_sites(rewritten))
        if chains:
            outcome.notes.append(f"{chains} GELU chain(s) fused into Gelu-20 nodes for {where}")
    elif target is not None:
        rewritten = decompose_gelu_ops(model, exact_form=PRIMITIVES if erf else ERF_FREE)
        if not erf:  # erf chains of the source, written in their flavour's Erf-free form
            for site in find_gelu_sites(rewritten):
                form = FLAVOURS[site.claimed].no_erf_form
                if site.op == "erf-chain" and form not in (None, PRIMITIVES):
                    rewritten = replace_site(rewritten, site, site.claimed, form=form)
            outcome.notes.append(f"exact GELU written without Erf for {target.name} (Erf-free polynomial)")
    if rewritten is not model:
        _save_onnx(rewritten, path)
    return outcome


def _save_onnx(model, path: Path) -> None:
    """Save in place, keeping weights in external data when the artifact had them."""
    import onnx

    from exporter.staging import companion_files

    companions = companion_files(path, "onnx")
    for name in companions:
        (path.parent / name).unlink()
    if companions:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=f"{path.name}.data")
    else:
        onnx.save(model, str(path))


def _tflite(path: Path, policy: str, target: Target | None) -> PolicyOutcome:
    from exporter.rewrites import lower_gelu_ops, set_gelu_approximate
    from verifiers.target_facts import version_greater
    from verifiers.tflite_model import load_tflite

    versions = {code.version for code in load_tflite(path).opcodes if code.name == "GELU"}
    has_builtin, integer = bool(versions), any(v >= 2 for v in versions)  # version 2: int8/uint8 GELU
    flag = "builtin_int8" if integer else "builtin"
    runs_builtin = target is None or (
        target.gelu.get(flag) is not False
        and not (target.max_runtime_version and version_greater(TFLITE_GELU_RUNTIME, target.max_runtime_version))
    )
    if integer and has_builtin and not runs_builtin:
        raise Incompatible(f"{target.name} does not run the int8 GELU builtin (gelu.builtin_int8: false), and an "
                           "int8 GELU cannot be written as other ops (each would need int8 ranges of its own): "
                           "this model's GELUs keep it off that target in int8")
    outcome = PolicyOutcome()
    if policy == "native" and not runs_builtin:
        raise Incompatible(f"--gelu native: {target.name} does not run the GELU builtin")
    if policy == "tanh":
        path.write_bytes(set_gelu_approximate(path.read_bytes()))
        outcome.declared = dict(TANH_DECLARED)
        outcome.notes.append(f"--gelu tanh: every GELU builtin set to approximate={_TFLITE_TANH_FLAG} (declared)")
    if has_builtin and not runs_builtin:
        path.write_bytes(lower_gelu_ops(path.read_bytes()))
        outcome.notes.append(f"GELU builtins written as MUL/ADD/TANH and erf-polynomial chains for {target.name}")
    return outcome


FORMAT_POLICIES = {"onnx": _onnx, "tflite": _tflite}
