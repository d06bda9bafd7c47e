"""Compare artifact outputs with the source model's: tolerances, output matching, error statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from verifiers.errors import BadInput
from verifiers.quantization.metrics import IntegerThresholds, judge_integer_output
from verifiers.report import VALUES, Finding, OutputResult


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


# Defaults by reference dtype.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-6, 1e-5),
    "float32": Tolerance(1e-4, 1e-3),
    "float16": Tolerance(1e-2, 1e-2),
    "bfloat16": Tolerance(5e-2, 5e-2),
}
EXACT = Tolerance(0.0, 0.0)  # integer and boolean outputs must match exactly
# Defaults for quantised artifacts, by --quantize mode: float16 weights are off by ~1e-3 relative,
# int8 weights by ~1e-2 (measured on the fixture models: fp16 1.5e-3, dynamic int8 1.5e-2 max abs).
QUANTIZED_TOLERANCES: dict[str, Tolerance] = {
    "fp16": Tolerance(1e-2, 1e-2),
    # bfloat16 keeps 8 significant bits to float16's 11: eight times its rounding, five times its tolerance.
    "bf16": Tolerance(5e-2, 5e-2),
    "dynamic-int8": Tolerance(5e-2, 5e-2),
}


@dataclass
class Tolerances:
    """Global and per-output overrides on top of the per-dtype defaults."""

    atol: float | None = None
    rtol: float | None = None
    per_output_atol: dict[str, float] = field(default_factory=dict)
    per_output_rtol: dict[str, float] = field(default_factory=dict)
    # NaN or Inf in the source's outputs fail the comparison unless this is set; then they pass
    # where the artifact has the same value at the same position (NaN for NaN, Inf of the same sign).
    allow_nonfinite: bool = False
    # Set for an integer (int8) artifact: float outputs pass on SQNR and top-1 agreement, not atol/rtol.
    integer: IntegerThresholds | None = None

    @classmethod
    def parse(cls, atol_options: list[str], rtol_options: list[str]) -> "Tolerances":
        """Parse repeatable options: a bare number sets the global value, NAME=VALUE one output's."""
        tolerances = cls()
        for option, values, per_output in (
            ("--atol", atol_options, tolerances.per_output_atol),
            ("--rtol", rtol_options, tolerances.per_output_rtol),
        ):
            for text in values:
                name, _, value = text.rpartition("=")
                number = _parse_nonnegative(option, text, value)
                if name:
                    per_output[name] = number
                elif option == "--atol":
                    tolerances.atol = number
                else:
                    tolerances.rtol = number
        return tolerances

    def scale_for(self, quantize: str) -> str:
        """Default to the quantisation's tolerances where no global one was given; say what was set."""
        scaled = QUANTIZED_TOLERANCES.get(quantize)
        if scaled is None:
            return f"no tolerance scaling known for --quantize {quantize}"
        if self.atol is None:
            self.atol = scaled.atol
        if self.rtol is None:
            self.rtol = scaled.rtol
        return f"tolerances scaled for --quantize {quantize}: atol {self.atol:g}, rtol {self.rtol:g}"

    def for_output(self, name: str, dtype: np.dtype) -> Tolerance:
        dtype = np.dtype(dtype)
        if dtype.kind in "iub":
            default = EXACT
        else:
            default = DEFAULT_TOLERANCES.get(dtype.name, DEFAULT_TOLERANCES["float32"])
        atol = self.per_output_atol.get(name, self.atol if self.atol is not None else default.atol)
        rtol = self.per_output_rtol.get(name, self.rtol if self.rtol is not None else default.rtol)
        return Tolerance(atol, rtol)

    def unknown_outputs(self, names: list[str]) -> list[str]:
        known = set(names)
        return sorted((set(self.per_output_atol) | set(self.per_output_rtol)) - known)


def _parse_nonnegative(option: str, text: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise BadInput(f"{option} {text!r}: expected a number or NAME=NUMBER", option=option[2:]) from None
    if not number >= 0:
        raise BadInput(f"{option} {text!r}: tolerance must be a non-negative number", option=option[2:])
    return number


def match_outputs(
    reference_names: list[str], names_are_real: bool, artifact_names: list[str]
) -> list[tuple[int, int]]:
    """Pair reference outputs with artifact outputs: by name when both sides name them, else by order."""
    if names_are_real and set(reference_names) <= set(artifact_names):
        return [(i, artifact_names.index(n)) for i, n in enumerate(reference_names)]
    if len(reference_names) != len(artifact_names):
        raise BadInput(
            f"the source model has {len(reference_names)} output(s) "
            f"({', '.join(reference_names)}) and the artifact {len(artifact_names)} "
            f"({', '.join(artifact_names)}); they cannot be matched by name or by order"
        )
    return [(i, i) for i in range(len(reference_names))]


# Decades of the absolute error histogram each output result carries (verifiers.report.OutputResult).
HISTOGRAM_LOG10_EDGES = tuple(range(-10, 3))
_HISTOGRAM_EDGES = np.power(10.0, HISTOGRAM_LOG10_EDGES)


def compare_outputs(
    reference_names: list[str],
    artifact_names: list[str],
    pairs: list[tuple[int, int]],
    reference_batches: list[list[np.ndarray]],
    artifact_batches: list[list[np.ndarray]],
    tolerances: Tolerances,
) -> tuple[list[OutputResult], list[Finding]]:
    """Error statistics per output over every batch; findings for the outputs that fail."""
    results: list[OutputResult] = []
    findings: list[Finding] = []
    for ref_index, art_index in pairs:
        name = reference_names[ref_index]
        art_name = artifact_names[art_index]
        refs = [batch[ref_index] for batch in reference_batches]
        arts = [batch[art_index] for batch in artifact_batches]
        result, finding = _compare_one(name, art_name, refs, arts, tolerances)
        results.append(result)
        if finding is not None:
            findings.append(finding)
    return results, findings


def _compare_one(name, art_name, refs, arts, tolerances):
    tol = tolerances.for_output(name, refs[0].dtype)
    base = dict(name=name, artifact_name=art_name, atol=tol.atol, rtol=tol.rtol)
    for ref, art in zip(refs, arts):
        if ref.shape != art.shape:
            result = OutputResult(
                shape=list(ref.shape), artifact_shape=list(art.shape), max_abs_err=None,
                max_rel_err=None, frac_out_of_tol=None, passed=False, **base,
            )
            message = (
                f"output {name}: shape differs, source {list(ref.shape)} vs artifact "
                f"{art_name} {list(art.shape)}"
            )
            return result, Finding("numeric", message, output=name, data={"cause": "shape"})

    nonfinite, nonfinite_message = _nonfinite(name, refs, arts, tolerances.allow_nonfinite)
    max_abs = max_rel = 0.0
    out_count = total = 0
    worst_batch, worst_count = 0, -1
    counts = np.zeros(len(HISTOGRAM_LOG10_EDGES) + 1, dtype=np.int64)
    for batch, (ref, art) in enumerate(zip(refs, arts)):
        ref64 = ref.astype(np.float64)
        art64 = art.astype(np.float64)
        finite = np.isfinite(ref64) & np.isfinite(art64)
        diff = np.abs(art64[finite] - ref64[finite])
        mag = np.abs(ref64[finite])
        total += ref.size
        outside = int(np.count_nonzero(diff > tol.atol + tol.rtol * mag))
        out_count += outside
        if outside > worst_count:
            worst_batch, worst_count = batch, outside
        counts += np.bincount(np.searchsorted(_HISTOGRAM_EDGES, diff, side="right"), minlength=counts.size)
        if diff.size:
            max_abs = max(max_abs, float(diff.max()))
            # Relative error is meaningless where the reference is near zero: skip those elements.
            significant = mag > max(tol.atol, np.finfo(np.float32).tiny)
            if significant.any():
                max_rel = max(max_rel, float((diff[significant] / mag[significant]).max()))
    passed = out_count == 0 and nonfinite_message is None
    integer = tolerances.integer if refs[0].dtype.kind == "f" else None
    metrics, integer_message = {}, None
    if integer is not None:
        metrics, integer_message = judge_integer_output(name, refs, arts, integer)
        metrics = {**metrics, "sqnr_db": _finite_or_none(metrics["sqnr_db"]),
                   "min_sqnr_db": integer.min_sqnr_db, "min_top1": integer.min_top1}
        passed = integer_message is None and nonfinite_message is None
    result = OutputResult(
        shape=list(refs[0].shape), artifact_shape=list(arts[0].shape), max_abs_err=max_abs,
        max_rel_err=max_rel, frac_out_of_tol=out_count / total if total else 0.0,
        passed=passed, nonfinite=nonfinite, **base,
        error_histogram={"log10_edges": list(HISTOGRAM_LOG10_EDGES), "counts": counts.tolist()}, **metrics,
    )
    if passed:
        return result, None
    if nonfinite_message is not None:
        message = nonfinite_message
    elif integer_message is not None:
        return result, Finding("numeric", integer_message, output=name, data={
            "cause": VALUES, "max_abs_err": max_abs,
            **{k: metrics[k] for k in ("sqnr_db", "cosine", "top1_agreement")}})
    else:
        message = (
            f"output {name}: max abs err {max_abs:.3g} (atol {tol.atol:g}), max rel err "
            f"{max_rel:.3g} (rtol {tol.rtol:g}); {100 * out_count / total:.3g}% of elements "
            f"out of tolerance"
        )
    return result, Finding("numeric", message, output=name, data={
        "cause": "nonfinite" if nonfinite_message is not None else VALUES, "max_abs_err": max_abs, "max_rel_err": max_rel, "frac_out_of_tol": out_count / total,
        "batch": worst_batch,  # the batch with the most elements out of tolerance
    })


def _finite_or_none(value: float) -> float | None:
    """A report number: SQNR is +inf for identical outputs and -inf against an all-zero reference."""
    return value if np.isfinite(value) else None


def _kind(value: float) -> str:
    return "NaN" if np.isnan(value) else ("+Inf" if value > 0 else "-Inf") if np.isinf(value) else f"{value:.6g}"


def _nonfinite(name: str, refs: list[np.ndarray], arts: list[np.ndarray], allowed: bool
               ) -> tuple[dict[str, int], str | None]:
    """Counts of NaN and ±Inf on each side, and why they fail the output (None: they do not).

    Positions where the two sides differ in kind (a NaN, +Inf or -Inf on one side and not the
    same on the other) always fail; the source's own NaN/Inf fail unless `allowed`."""
    counts: dict[str, int] = {}
    if refs[0].dtype.kind not in "fc" and arts[0].dtype.kind not in "fc":
        return counts, None
    mismatched = total_source = 0
    first_mismatch = first_source = None
    for batch, (ref, art) in enumerate(zip(refs, arts)):
        ref64, art64 = ref.astype(np.float64), art.astype(np.float64)
        for side, values in (("source", ref64), ("artifact", art64)):
            for label, test in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
                n = int(np.count_nonzero(test(values)))
                if n:
                    counts[f"{label} in {side}"] = counts.get(f"{label} in {side}", 0) + n
        differ = (np.isnan(ref64) != np.isnan(art64)) | (np.isposinf(ref64) != np.isposinf(art64)) \
            | (np.isneginf(ref64) != np.isneginf(art64))
        mismatched += int(np.count_nonzero(differ))
        if first_mismatch is None and differ.any():
            index = tuple(int(i) for i in np.argwhere(differ)[0])
            first_mismatch = (batch, index, _kind(ref64[index]), _kind(art64[index]))
        source_bad = ~np.isfinite(ref64)
        total_source += int(np.count_nonzero(source_bad))
        if first_source is None and source_bad.any():
            index = tuple(int(i) for i in np.argwhere(source_bad)[0])
            first_source = (batch, index, _kind(ref64[index]))
    if mismatched:
        batch, index, ref_kind, art_kind = first_mismatch
        return counts, (f"output {name}: NaN/Inf differ at {mismatched} position(s), first in batch {batch} at "
                        f"{list(index)}: source {ref_kind}, artifact {art_kind}")
    if total_source and not allowed:
        batch, index, kind = first_source
        found = ", ".join(f"{count} {label}" for label, count in counts.items() if label.endswith("source"))
        return counts, (f"output {name}: the source computes non-finite values ({found}), first in batch {batch} "
                        f"at {list(index)}: {kind}; the artifact matches them, but nothing can be compared "
                        "there (--allow-nonfinite accepts matching NaN/Inf)")
    return counts, None
