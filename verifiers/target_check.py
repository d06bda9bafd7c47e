"""`exportgate check ARTIFACT --target NAME`: what in an artifact a target runtime or device lacks.

`check_artifact(artifact, target)` reads an artifact (structure only: nothing runs, no TensorFlow
or torch is imported) and returns every incompatibility with the target's entry in
opset_matrix.yaml (verifiers/target_matrix.py), not only the first. Each format's own checks live
in its module (verifiers/formats/), the matrix facts and messages they share in
verifiers/target_facts.py. Each one names what is wrong, where (GELU site id, node or op) and the matrix fact it breaks with its source, abbreviated. A matrix
value of None claims nothing, so it never makes an incompatibility, with one exception the
matrix states in its header: com.microsoft ops are ONNX Runtime contrib ops, so a target whose
runtime is not ONNX Runtime cannot run them whatever its (unsourced) contrib_gelu says.

ONNX (verifiers/formats/onnx.py): format, default-domain opset > max_opset, Gelu (gelu.gelu_op), Erf (gelu.erf),
com.microsoft ops (gelu.contrib_gelu, runtime), op_gaps (an optional dtype: "Erf[float64]" in
the op field, or "no float64 ..." in the note, checked against the op's input types) and tensor
dtypes outside `dtypes`. TFLite (verifiers/formats/tflite.py): format, min_runtime_version (metadata or computed, the higher)
> max_runtime_version, GELU builtin (gelu.builtin for op version 1, gelu.builtin_int8 for 2),
SIGN (gelu.sign_op), an unfused tanh chain (gelu.tanh_chain), custom and Flex ops (always),
op_gaps and dtypes. Both formats, for integer devices (verifiers/precision.py): float compute on
an integer_only target ("precision", one naming the mode and the first float op), a dynamic input
axis on a static_shapes target and, for TFLite, an activation breaking max_rank or max_inner_dims
("shape"), an op outside the target's `ops` ("op").

`to_findings` turns them into report Findings: kind "opset" for an opset above the target's,
"target" for everything else (both exit 4).
"""

from __future__ import annotations

from pathlib import Path

from verifiers.formats import FORMATS, Artifact, open_artifact
from verifiers.report import Finding
from verifiers.target_facts import Incompatibility
from verifiers.targets import Target


def check_artifact(artifact: Artifact | str | Path, target: Target) -> list[Incompatibility]:
    """Every incompatibility of an artifact (or the file at a path) with `target` (empty:
    compatible as far as the matrix says). Unreadable files raise BadInput."""
    if isinstance(artifact, (str, Path)):
        artifact = open_artifact(artifact)
    fmt = artifact.format
    if fmt.name != target.format:
        wanted = FORMATS[target.format]
        return [Incompatibility("format", (
            f"{artifact.path.name} is {fmt.article} {fmt.title} artifact; {target.name} takes {wanted.title} "
            f"artifacts (matrix format: {target.format})"
        ), {"artifact_format": fmt.name, "target_format": target.format, "fact": "format"})]
    return artifact.check_target(target)


def to_findings(incompatibilities: list[Incompatibility], target: Target, command: str = "check") -> list[Finding]:
    """Report findings: "opset" for the opset, "target" for everything else (both exit 4), each
    message ending with what fixes it where an export option does: for `check` (an artifact from
    anywhere) the export command for the target, for an export the options to add."""
    return [
        Finding(
            kind="opset" if inc.kind == "opset" else "target",
            message=inc.message + _advice(inc, target, command),
            site=inc.detail.get("site"),
            data={"incompatibility": inc.kind, **inc.detail, **({"fix": inc.fix} if inc.fix is not None else {})},
        )
        for inc in incompatibilities
    ]


def _advice(inc: Incompatibility, target: Target, command: str) -> str:
    if inc.fix is None:
        return ""
    if command == "export":
        return f"; add {inc.fix}" if inc.fix else ""
    return (f"; exportgate export MODEL --to {target.format} --target {target.name}"
            f"{' ' + inc.fix if inc.fix else ''} writes one it takes")
