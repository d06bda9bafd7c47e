"""Full-integer (int8) exports and their verification, the model layer's part: the options,
the calibration data, what stayed float, and the float twin a weak run is diagnosed against.

What can be said of any int8 artifact (its precision, SQNR and top-1, per-layer errors) lives in
verifiers/ (verifiers.precision, verifiers.quantization.metrics, verifiers.quantization.layers).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

from exporter.options import flag_of
from exporter.routes import check_io
from exporter.sources import Source, make_batches
from verifiers.errors import BadInput
from verifiers.naming import shown
from verifiers.formats import Artifact
from verifiers.quantization.metrics import IntegerThresholds
from verifiers.report import Report
from verifiers.runtimes import Runner

INTEGER_MODES = ("int8", "int16", "mixed")  # precisions judged by SQNR and top-1, not atol/rtol ("mixed": some ops left float)
CALIBRATION_BATCHES = 8  # seeded random batches when no --calibration is given
# An output whose SQNR is within this of --min-sqnr is weak: its layers are diagnosed as on a failure.
WEAK_MARGIN_DB = 6.0


def check_integer_options(quantize: str | None, io: str, calibration: str | None, allow_float_ops: bool) -> None:
    """The int8 options make sense together (before the model loads)."""
    check_io(io, quantize)
    needs_int8 = [name for name, given in (("calibration", calibration is not None),
                                           ("allow_float_ops", allow_float_ops)) if given]
    if needs_int8 and quantize != "int8":
        raise BadInput(f"{flag_of(needs_int8[0])} applies to full-integer exports only: add --quantize int8",
                       option=needs_int8[0])


def thresholds(min_sqnr: float | None, min_top1: float | None) -> IntegerThresholds:
    defaults = IntegerThresholds()
    return IntegerThresholds(defaults.min_sqnr_db if min_sqnr is None else min_sqnr,
                             defaults.min_top1 if min_top1 is None else min_top1)


def calibration_feeds(source: Source, spec: str | None, seed: int, axes=()) -> tuple[list[dict], dict]:
    """The feeds an int8 export is calibrated on, and how the report describes them: the user's
    data (sizes along the dynamic `axes` free), or seeded random batches (a different seed from
    the verification batches')."""
    if spec is not None:
        from exporter.calibration import load_calibration

        casts: dict[str, str] = {}
        feeds = load_calibration(spec, source.inputs, dynamic={(a.input, a.axis) for a in axes}, casts=casts)
        return feeds, {"source": spec, "batches": len(feeds), "random": False, **({"cast": casts} if casts else {})}
    feeds = make_batches(source, seed + 1, CALIBRATION_BATCHES)
    return feeds, {"source": f"random (seed {seed + 1})", "batches": len(feeds), "random": True}


def cast_calibration_note(calibration: dict) -> str:
    casts = ", ".join(f"{name} {cast}" for name, cast in calibration["cast"].items())
    return (f"--calibration {calibration['source']}: cast to the model's input types ({casts}); values the "
            "narrower type cannot hold are rounded or lost (give data of the model's types)")


def random_calibration_note(calibration: dict) -> str:
    return (f"int8 calibration ran on {calibration['batches']} seeded random batch(es), not on real data: the "
            "ranges it chose, and so this verdict, are no evidence of accuracy on real inputs (give --calibration)")


def record_precision(report: Report, artifact: Artifact, limits: IntegerThresholds, tolerances):
    """The artifact's precision in report.quantization (an int8 export's route has refused ops
    left float already, unless --allow-float-ops); an integer artifact's outputs are judged by `limits`."""
    precision = artifact.precision()
    quantized_io = {io.dtype for io in (*precision.inputs, *precision.outputs) if io.scale is not None}
    report.quantization.update({"mode": precision.mode, "io": "/".join(sorted(quantized_io)) or "float"})
    if precision.mode in INTEGER_MODES:  # (in a float or float-weight artifact every op computes in float)
        report.quantization["float_ops"] = [asdict(op) for op in precision.float_ops]
        violations = artifact.int8_spec_violations()
        if violations is not None:
            report.quantization["spec_violations"] = [asdict(v) for v in violations]
        if violations:
            report.notes.append(f"{len(violations)} departure(s) from the int8 quantization spec, first: "
                                f"{violations[0].message}")
        tolerances.integer = limits
        report.notes.append(f"int8 artifact: outputs are judged by SQNR >= {limits.min_sqnr_db:g} dB and, over "
                            f"classes, top-1 agreement >= {limits.min_top1:g} (--min-sqnr, --min-top1)")
    if precision.float_ops and precision.mode == "mixed":
        first, n = precision.float_ops[0], len(precision.float_ops)
        report.notes.append(f"{n} op(s) compute in float, first {shown(first.node)} ({first.op_type}) on "
                            f"{first.dtype} tensor {shown(first.tensor)}")
    return precision


def weak_outputs(report: Report) -> list[str]:
    """The outputs of an integer artifact that fail or come within WEAK_MARGIN_DB of the SQNR floor."""
    return [o.name for o in report.outputs if o.min_sqnr_db is not None and (
        not o.passed or (o.sqnr_db is not None and o.sqnr_db < o.min_sqnr_db + WEAK_MARGIN_DB))]


def float_twin(route, source: Source, request, folder: Path, name: str, progress) -> Path:
    """The same export without quantization, in `folder`: the float model a weak int8 artifact's
    layers are compared with."""
    from dataclasses import replace

    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / name
    float_request = replace(request, quantize=None, io="float", calibration=[], allow_float=False)
    progress("exporting the float model to compare the int8 artifact's layers with")
    route.export(source, float_request, dest, progress)
    return dest


def diagnose_layers(report: Report, artifact: Artifact, float_model: Path, feeds: list[dict],
                    limits: IntegerThresholds, runner: Runner, progress) -> None:
    """Each quantized tensor against the float model's (`feeds`: float, under the artifact's input
    names), worst first, in report.quantization; the first layer in graph order below the SQNR
    floor is named in the finding of every failing output. Both models run in the runtime that
    runs the artifact, in its worker (its limits hold; a crash there is a note: a diagnosis never
    changes the verdict)."""
    from verifiers.quantization.layers import diagnose_layers as layer_diagnosis, first_collapse
    from verifiers.runtimes import isolation, runtime_for

    step = "comparing the int8 artifact's layers with the float model's"
    progress(step)
    try:
        diagnosis = isolation.call(layer_diagnosis, artifact.path, float_model, feeds, artifact.format.name,
                                   runtime_for(artifact.format.name, runner.runtime), runtime=runner.runtime,
                                   step=step, runner=runner)
    except isolation.RuntimeCrashed as exc:
        report.notes.append(f"int8 layers: not compared: {exc}")
        return
    report.quantization["layers"] = [_layer(layer) for layer in diagnosis.layers]
    report.notes.append(f"int8 layers: {diagnosis.summary(limits.min_sqnr_db)}")
    collapse = first_collapse(diagnosis.layers, limits.min_sqnr_db)
    if collapse is None:
        return
    report.quantization["first_collapse"] = _layer(collapse)
    for finding in report.failures:
        if finding.kind == "numeric" and finding.output is not None:
            finding.data["first_collapse"] = _layer(collapse)
            finding.message += (f"; first layer below {limits.min_sqnr_db:g} dB: {shown(collapse.tensor)} "
                                f"({collapse.op_type}) at {collapse.sqnr_db:.1f} dB SQNR")


def _layer(layer) -> dict:
    """A layer's entry in the report; its SQNR is None where it is not finite (identical tensors,
    or an all-zero float tensor)."""
    entry = asdict(layer)
    entry["sqnr_db"] = entry["sqnr_db"] if math.isfinite(entry["sqnr_db"]) else None
    return entry
