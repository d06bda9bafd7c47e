"""`exportgate measure --gelu-forms`: the same artifact with its GELUs written in each other form
the file allows, to measure what each form costs in the runtime (exporter.checks.measurement
measures them in turn with the artifact). Each form is written by the rewrites export's --gelu
uses (exporter.rewrites), so the figures are those of the artifacts --gelu would give:

  ONNX    Gelu ops (opset 20 and later) written as primitives (the erf and tanh chains
          decompose_gelu_ops writes, as --gelu preserve does for a target without Gelu-20), or
          erf/tanh chains fused into Gelu ops (fuse_gelu_chains, as for a target with it: opset 20
          and later only); and every GELU site as a Relu, which is no GELU at all: the cost of
          the activation itself, the seed's comparison.
  TFLite  GELU builtins written as primitives (lower_gelu_ops, --gelu preserve for a runtime
          without the builtin); and as RELU, the same yardstick.

A form the file cannot take is said, with why, not measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from verifiers.errors import BadInput


RELU = "ReLU (not GELU: the activation's own cost)"
PRIMITIVES_LOWERED = "primitives (GELU builtins lowered)"


@dataclass(frozen=True)
class GeluForm:
    """The artifact rewritten: `name` says how its GELUs are written; `keeps_flavour` false where
    the rewrite computes another function (ReLU), measured only as a yardstick."""

    name: str
    path: Path
    keeps_flavour: bool = True


def gelu_forms(path: Path, format_name: str, folder: Path) -> tuple[list[GeluForm], list[str]]:
    """The forms of the artifact at `path` written into `folder`, and a note for each form it
    cannot take."""
    if format_name not in FORMAT_FORMS:
        raise BadInput(f"--gelu-forms: {format_name} artifacts have no GELU rewrites (ONNX and TFLite do)")
    return FORMAT_FORMS[format_name](path, folder)


def _onnx_forms(path: Path, folder: Path) -> tuple[list[GeluForm], list[str]]:
    import onnx

    from exporter.rewrites import decompose_gelu_ops, fuse_gelu_chains, gelu_op_sites
    from verifiers.formats.onnx.gelu_writer import GELU_OP_MIN_OPSET, replace_sites
    from verifiers.formats.onnx.gelu_sites import find_gelu_sites
    from verifiers.onnx_model import default_opset

    model = onnx.load(str(path))
    sites = [site for site in find_gelu_sites(model) if site.used]
    if not sites:
        return [], ["GELU forms: the artifact has no GELU site, so no form to compare"]
    forms, notes = [], []
    if gelu_op_sites(model):
        forms.append(GeluForm("primitives (Gelu ops decomposed)", _save(decompose_gelu_ops(model), folder, "primitives")))
    elif (default_opset(model) or 0) >= GELU_OP_MIN_OPSET:
        fused = fuse_gelu_chains(model)
        if gelu_op_sites(fused):
            forms.append(GeluForm("Gelu ops (chains fused)", _save(fused, folder, "gelu_op")))
        else:
            notes.append("GELU forms: no chain here fuses into a Gelu op (float16 chains and chains of uncertain "
                         "flavour stay as they are)")
    else:
        notes.append(f"GELU forms: Gelu ops need opset {GELU_OP_MIN_OPSET}, the artifact is at opset "
                     f"{default_opset(model)} (export with --opset {GELU_OP_MIN_OPSET} to have them measured)")
    try:
        relu = replace_sites(model, [(site, "relu") for site in sites])
    except ValueError as exc:  # a site whose inner tensors other ops read
        notes.append(f"GELU forms: ReLU not written ({exc})")
    else:
        forms.append(GeluForm(RELU, _save(relu, folder, "relu"), keeps_flavour=False))
    return forms, notes


def _tflite_forms(path: Path, folder: Path) -> tuple[list[GeluForm], list[str]]:
    from exporter.rewrites import lower_gelu_ops

    content = path.read_bytes()
    forms = []
    for name, written_as, file_name in ((PRIMITIVES_LOWERED, None, "primitives"), (RELU, "relu", "relu")):
        try:
            rewritten = lower_gelu_ops(content, written_as)
        except ValueError as exc:  # an int8 GELU, buffers outside the flatbuffer
            return [], [f"GELU forms: the GELU builtins cannot be rewritten ({exc})"]
        if rewritten == content:
            return [], ["GELU forms: the artifact has no GELU builtin, so no form to compare"]
        written = folder / f"{file_name}.tflite"
        written.write_bytes(rewritten)
        forms.append(GeluForm(name, written, keeps_flavour=written_as is None))
    return forms, []


def _save(model, folder: Path, name: str) -> Path:
    import onnx

    path = folder / f"{name}.onnx"
    large = model.ByteSize() > 1_800_000_000  # protobuf's 2 GB limit: weights beside the file
    onnx.save(model, str(path), save_as_external_data=large, all_tensors_to_one_file=True,
              location=f"{name}.onnx.data")
    return path


FORMAT_FORMS = {"onnx": _onnx_forms, "tflite": _tflite_forms}  # as exporter.gelu_policy's FORMAT_POLICIES
