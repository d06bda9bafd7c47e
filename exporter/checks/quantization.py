"""The quantization check: the artifact's precision (its mode, quantized inputs and outputs, ops
left float, departures from the int8 spec) recorded before anything runs; an integer artifact's
outputs judged by SQNR and top-1 instead of atol/rtol; and the layers of one whose outputs fail or
come near the SQNR floor compared with a float twin of the source (Verification.float_twin), in
the runtime's worker."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

from exporter.checks.data import OnData
from exporter.verification import Check, Verification
from verifiers.formats import Artifact
from verifiers.judging import named_feed
from verifiers.naming import shown
from verifiers.quantization.metrics import IntegerThresholds
from verifiers.report import Report
from verifiers.runtimes import Runner
from verifiers.steps import Step

INTEGER_MODES = ("int8", "int16", "mixed")  # precisions judged by SQNR and top-1, not atol/rtol ("mixed": some ops left float)
# An output whose SQNR is within this of --min-sqnr is weak: its layers are diagnosed as on a failure.
WEAK_MARGIN_DB = 6.0


def thresholds(min_sqnr: float | None, min_top1: float | None) -> IntegerThresholds:
    defaults = IntegerThresholds()
    return IntegerThresholds(defaults.min_sqnr_db if min_sqnr is None else min_sqnr,
                             defaults.min_top1 if min_top1 is None else min_top1)


def record_precision(report: Report, artifact: Artifact, limits: IntegerThresholds, tolerances):
    """The artifact's precision in report.quantization (an int8 export's route has refused ops
    left float already, unless --allow-float-ops); an integer artifact's outputs are judged by `limits`."""
    precision = artifact.precision()
    quantized_io = {io.dtype for io in (*precision.inputs, *precision.outputs)
                    if io.scale is not None or io.dtype in ("float16", "bfloat16")}
    report.quantization.update({"mode": precision.mode, "io": "/".join(sorted(quantized_io)) or "float"})
    if precision.mode == "fp16" and tolerances.atol is None and tolerances.rtol is None:
        tolerances.scale_for("fp16")
        report.notes.append(f"float16 tolerances, the artifact holding float16 values: atol {tolerances.atol:g}, "
                            f"rtol {tolerances.rtol:g} (--atol and --rtol set others)")
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
        diagnosis = isolation.call(layer_diagnosis, artifact.path, float_model, feeds, artifact.format,
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


def integer_artifact(run: Verification) -> bool:
    return run.report.quantization.get("mode") in INTEGER_MODES


def _record_precision(run: Verification) -> None:
    record_precision(run.report, run.artifact, thresholds(run.options["min_sqnr"], run.options["min_top1"]),
                     run.tolerances)


def _wants_layers(run: Verification) -> bool:
    """An integer artifact with outputs that fail or come close to it; on --data, with outputs that
    fail there (its verdict rests on the data)."""
    if not (run.active and integer_artifact(run)):
        return False
    if run.options["data"]:
        return run.of(OnData).worst is not None and any(f.data.get("data") for f in run.report.failures)
    return bool(weak_outputs(run.report))


def _diagnose_layers(run: Verification) -> None:
    """On the failing batches, or on --data's batch holding the worst sample."""
    batches = [run.of(OnData).worst[0]] if run.options["data"] else run.feeds
    feeds = [named_feed(run.runner, feed) for feed in batches]
    diagnose_layers(run.report, run.artifact, run.float_twin(), feeds, run.tolerances.integer, run.runner, run.progress)


PRECISION = Step("precision", _record_precision)  # read off the artifact before anything runs it

CHECK = Check(
    "quantization",
    on_artifact=(Step("layers", _diagnose_layers, when=_wants_layers),),
    keeps_source=integer_artifact,  # for the float twin its layers are compared with
)
