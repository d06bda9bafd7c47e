"""The report: findings, per-output results, the verdict and its exit code, and a human summary
(verifiers.writers writes it to files).

The exit code is derived from the findings here and nowhere else.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata
from typing import Any

# Finding kind -> exit code. Listed from most to least severe: when several kinds are found,
# the first one listed decides the exit code.
EXIT_CODES: dict[str, int] = {
    # The run was stopped by a signal (Ctrl-C, or a CI job's kill): 128 + the signal's number.
    "interrupted": 130,
    "terminated": 143,
    "input": 2,
    "internal": 2,  # an error exportgate did not foresee: its one line is in the finding
    "opset": 4,
    "target": 4,
    "runtime": 4,  # the runtime crashed, hung or ran out of memory on the artifact (verifiers.runtimes.isolation)
    "gelu": 3,
    "numeric": 1,
    # The GELU guard could not read the source graph: no GELU is known changed, so outputs that
    # differ (exit 1) say more; alone it fails the run with exit 3 unless --no-gelu-guard.
    "gelu_guard": 3,
    # Over a budget (--max-latency, --max-memory) or slower than the baseline beyond --max-regression,
    # by the measurement's confidence intervals (verifiers.measurement): the artifact is right, and
    # costs more than it may.
    "budget": 5,
}

# Distributions whose versions a report records (read from metadata; nothing is imported).
REPORTED_PACKAGES = (
    "exportgate",
    "numpy",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "torch",
    "tensorflow",
    "tensorflow-cpu",
    "keras",
    "tf2onnx",
    "ai-edge-litert",
    "litert-torch",
    "openvino",
)


# Lists that grow with the model, one entry per op or tensor (ops computing in float, int8
# layers, spec departures, the divergence profile), wherever they stand in a report: its JSON
# keeps the first LIST_CAP entries of each and the count as `<name>_total`, unless full_lists.
LONG_LISTS = frozenset({"float_ops", "layers", "spec_violations", "profile"})
LIST_CAP = 20


def _capped(value: Any) -> Any:
    """`value` (a report's dict form) with every LONG_LISTS list cut to LIST_CAP entries."""
    if isinstance(value, list):
        return [_capped(item) for item in value]
    if not isinstance(value, dict):
        return value
    capped = {}
    for key, item in value.items():
        if key in LONG_LISTS and isinstance(item, list) and len(item) > LIST_CAP:
            capped[key], capped[f"{key}_total"] = _capped(item[:LIST_CAP]), len(item)
        else:
            capped[key] = _capped(item)
    return capped


# What a numeric finding is about (its data["cause"]): VALUES, numbers beyond what is allowed (the
# tolerances, an int8 output's SQNR or top-1, a generated token), which a declared GELU change can
# explain; "shape", "nonfinite" (NaN/Inf where the source has none, or its own ones), "run" (the
# artifact fails to run at a size), which none can.
VALUES = "values"


@dataclass
class Finding:
    kind: str
    message: str
    output: str | None = None
    site: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in EXIT_CODES:
            raise ValueError(f"unknown finding kind {self.kind!r}")


@dataclass
class OutputResult:
    name: str
    shape: list[int]
    max_abs_err: float | None
    max_rel_err: float | None
    frac_out_of_tol: float | None
    atol: float
    rtol: float
    passed: bool
    artifact_name: str | None = None
    artifact_shape: list[int] | None = None
    nonfinite: dict[str, int] = field(default_factory=dict)
    # How many elements' |artifact - source| fall in each decade: counts[0] below
    # 10**log10_edges[0] (exact matches included), counts[k] from 10**edges[k-1], the last at or above 10**edges[-1].
    error_histogram: dict[str, list] = field(default_factory=dict)
    # An integer (int8) artifact is judged by these instead of atol/rtol (verifiers.quantization.metrics):
    # SQNR in dB (None when the outputs are identical), cosine similarity, and top-1 agreement for
    # outputs whose last axis holds classes.
    sqnr_db: float | None = None
    cosine: float | None = None
    top1_agreement: float | None = None
    min_sqnr_db: float | None = None
    min_top1: float | None = None


@dataclass
class ArtifactInfo:
    path: str
    format: str
    sha256: str
    size_bytes: int
    data_files: list[dict[str, Any]] = field(default_factory=list)


def library_versions() -> dict[str, str]:
    versions = {}
    for name in REPORTED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _dataclass(cls, data: dict[str, Any] | None):
    if data is None:
        return None
    names = {f.name for f in fields(cls)}
    return cls(**{key: value for key, value in data.items() if key in names})


EXIT_PRECEDENCE = tuple(dict.fromkeys(EXIT_CODES.values()))  # 130, 143, 2, 4, 3, 1, 5: the first present wins


def _held(entries: list[dict[str, Any]]) -> list[str]:
    """`x axis 1 at 1, 3, 6, 15` per axis; a symbol of more than three axes as one:
    `batch_size (7 axes) at 1, 2, 3, 7`."""
    by_symbol: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        by_symbol.setdefault(entry["symbol"], []).append(entry)
    held = []
    for symbol, axes in by_symbol.items():
        sizes = ", ".join(map(str, axes[0]["sizes"]))
        if len(axes) > 3:
            held.append(f"{symbol} ({len(axes)} axes) at {sizes}")
        else:
            held.extend(f"{d['input']} axis {d['axis']} at {', '.join(map(str, d['sizes']))}" for d in axes)
    return held


def combined_exit_code(codes) -> int:
    """The exit code of several runs, as of one run's several findings: the most severe."""
    present = set(codes)
    return next((code for code in EXIT_PRECEDENCE if code in present), 0)


@dataclass
class Report:
    command: str
    model: str | None = None
    # A transformers model folder: its config's model_type and the task it was exported for.
    model_type: str | None = None
    task: str | None = None
    # The files the source model was built from: [{"path", "sha256", "size_bytes"}] (its spec file,
    # the user's modules it imported, the files it read while loading).
    source_files: list[dict[str, Any]] = field(default_factory=list)
    artifact: ArtifactInfo | None = None
    format: str | None = None
    runtime: str | None = None  # the runtime that ran the artifact (verifiers.runtimes; verify --runtime)
    # An artifact that computes below float32 (float16): what each way of running it computed in, by
    # variant ("default": the runtime's own run; "float16": float16 arithmetic emulated op by op), for a
    # float16 artifact and for a runtime that picks its own precision (OpenVINO).
    arithmetic: dict[str, str] = field(default_factory=dict)
    requested_opset: int | None = None
    actual_opset: int | None = None
    exporter: str | None = None
    quantize: str | None = None
    target: str | None = None
    target_checks: list[dict[str, Any]] = field(default_factory=list)  # incompatibilities with the target
    min_runtime_version: str | None = None  # TFLite artifacts
    verified: bool = False  # the artifact ran against the source (its outputs compared, or an LLM's generation)
    outputs: list[OutputResult] = field(default_factory=list)
    # The same comparison for the runtime's other ways of running the artifact (LiteRT without XNNPACK).
    variant_outputs: dict[str, list[OutputResult]] = field(default_factory=dict)
    # --measure, or `exportgate measure`: what the artifact costs in its runtime (verifiers.measurement:
    # load, latency per variant and batch with its 95% interval, throughput, peak memory, machine load).
    measurement: dict[str, Any] = field(default_factory=dict)
    gelu_guard: str = "not run"  # "checked", "off (--no-gelu-guard)", or "failed: why"
    gelu: list[dict[str, Any]] = field(default_factory=list)  # one entry per GELU site pair
    # The activations a model folder's config declares, {"declared": {key: {"name", "flavour"}}, and
    # the GELU sites computing none of them, "off": [{"side", "site", "op", "flavour"}]} (verifiers.gelu.configured).
    gelu_configured: dict[str, Any] = field(default_factory=dict)
    # Per output: how far swapping every exact/tanh GELU of the artifact moves it.
    gelu_swap_effect: dict[str, float] = field(default_factory=dict)
    # One entry per dynamic axis: {"input", "axis", "symbol", "export_size", "sizes", "range",
    # "status": "pass" | "fail" | "skipped", "detail", "max_abs_err": {size: err}} (verifiers.sizes).
    dynamic: list[dict[str, Any]] = field(default_factory=list)
    # Why a dynamic axis may not hold at other sizes, seen before running: {"kind", "message",
    # "location"}. Hints only: the verdict comes from the runs at other sizes.
    dynamic_hints: list[dict[str, Any]] = field(default_factory=list)
    # An integer artifact: {"mode", "io", "float_ops", "calibration": {"source", "batches", "random"},
    # "method", "layers": [{"tensor", "op_type", "sqnr_db", ...} worst first], "first_collapse"}. An ONNX
    # fp16 export: {"mode": "fp16", "io", "method", "measured_on": {"source", "batches", "random"}, "ops",
    # "kept_float32": [{"node", "op_type", "why", "max_abs"}]} (exporter.routes.onnx_float16).
    quantization: dict[str, Any] = field(default_factory=dict)
    # Where a numeric difference starts (a red run, or --localize; verifiers.localization): {"first": {"node",
    # "op_type", "module", "source", "introduced_max_abs", "inherited_max_abs", "covers", "tensor",
    # "tolerance"} or None, "path": [the next diverging ops], "aligned": artifact tensors matched with the
    # source's, "computed": float tensors it computes, "profile": [{"order", "node", "max_abs",
    # "introduced_max_abs", "tolerance"} per aligned tensor], "batch": which batch, "message": one line}.
    divergence: dict[str, Any] = field(default_factory=dict)
    # A decoder with past run as generation runs it (exporter.checks.generation): prompt_length,
    # decode_steps, variants (the runtime's ways of running it that generated, each on its own cache;
    # steps are the first's), tokens (transformers' generate), steps [{step, past_length, max_abs_err, worst_row,
    # tokens, expected_tokens, tied_rows: the rows whose token differs where the top two logits tie
    # within the artifact's error (a note, not a failure)}]. On --data's prompts: prompts (their
    # number), decode_steps, steps [{step, max_abs_err, worst_sample, samples, tokens_differ and
    # tied_samples: sample numbers}].
    generation: dict[str, Any] = field(default_factory=dict)
    failures: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    seed: int | None = None
    batches: int | None = None  # random batches
    example_batch: bool = False  # whether the source's example inputs ran too
    # What each batch fed: [{"batch", "origin" (the source's example inputs, or seeded random with
    # its seed), "inputs": {name: {"shape", "dtype", "min", "max"}}}].
    feeds: list[dict[str, Any]] = field(default_factory=list)
    # --data (exporter.checks.data): {"spec", "files": [{"path", "sha256"}], "samples", "batches",
    # "batch_size", "filled" (samples repeated to fill a batch), "shapes", "inputs": {name: {"min",
    # "max"}}, "outputs": [{"name", "variant", "samples", "atol", "rtol", "samples_out_of_tolerance", "failing_samples",
    # "sqnr_db_all_samples", and per statistic (max_abs, mean_abs, sqnr_db, cosine, top1, top5)
    # {"mean", "worst", "worst_sample"}}]}. Samples are numbered from 0.
    data: dict[str, Any] = field(default_factory=dict)
    rejected_artifact: str | None = None
    full_lists: bool = False  # --full-lists: the JSON keeps every entry of the LONG_LISTS
    # Files published beside the artifact: a model folder's tokenizer and preprocessor files, by name.
    published_beside: list[str] = field(default_factory=list)
    # A job of `exportgate run` restored from the cache: {"key": its digest, "made": when the result was made}.
    reused: dict[str, str] | None = None
    versions: dict[str, str] = field(default_factory=library_versions)

    @contextlib.contextmanager
    def timed(self, step: str) -> Iterator[None]:
        """Record how long a step took in timings[step]."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[step] = round(time.perf_counter() - start, 4)

    def fail(self, kind: str, message: str, **details: Any) -> Finding:
        finding = Finding(kind=kind, message=message, **details)
        self.failures.append(finding)
        return finding

    @property
    def exit_code(self) -> int:
        for kind, code in EXIT_CODES.items():
            if any(f.kind == kind for f in self.failures):
                return code
        return 0

    @property
    def verdict(self) -> str:
        return "pass" if self.exit_code == 0 else "fail"

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        return {"verdict": self.verdict, "exit_code": self.exit_code, **(body if self.full_lists else _capped(body))}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """The report `to_dict` gave (read back from a JSON report); unknown keys are ignored, so a
        report written by another exportgate version reads as far as the fields agree."""
        names = {f.name for f in fields(cls)}
        body = {key: value for key, value in data.items() if key in names}
        body["artifact"] = _dataclass(ArtifactInfo, body.get("artifact"))
        body["outputs"] = [_dataclass(OutputResult, o) for o in body.get("outputs") or []]
        body["variant_outputs"] = {variant: [_dataclass(OutputResult, o) for o in outputs]
                                   for variant, outputs in (body.get("variant_outputs") or {}).items()}
        body["failures"] = [_dataclass(Finding, f) for f in body.get("failures") or []]
        return cls(**body)

    def _passed_line(self, passed: list[OutputResult]) -> str:
        over = f" over {len(self.feeds) or (self.batches or 0) + self.example_batch} input batch(es)"
        judged = [o for o in passed if o.min_sqnr_db is not None]
        if not judged:
            worst = max((o.max_abs_err or 0.0) for o in passed)
            return f"  {len(passed)} output(s) within tolerance, max abs err {worst:.3g}{over}"
        sqnr = [o.sqnr_db for o in judged if o.sqnr_db is not None]
        top1 = [o.top1_agreement for o in judged if o.top1_agreement is not None]
        parts = [f"SQNR {min(sqnr):.1f} dB at worst (min {judged[0].min_sqnr_db:g})" if sqnr else "identical"]
        if top1:
            parts.append(f"top-1 agreement {min(top1):.3f} (min {judged[0].min_top1:g})")
        return f"  {len(passed)} output(s) pass as int8: {', '.join(parts)}{over}"

    def _data_line(self) -> str:
        data = self.data
        worst = max((o for o in data["outputs"] if "max_abs" in o), key=lambda o: o["max_abs"]["worst"] or 0.0,
                    default=None)
        line = f"  on {data['spec']}: {data['samples']} sample(s) in {data['batches']} batch(es), every output within " \
               "tolerance"
        if worst is not None:
            line += f", max abs err {worst['max_abs']['worst']:.3g} at worst (sample {worst['max_abs']['worst_sample']}" \
                    f"{', output ' + worst['name'] if len(data['outputs']) > 1 else ''})"
        return line

    def _quantization_lines(self) -> list[str]:
        q = self.quantization
        calibration = q.get("calibration")
        head = f"  quantization: {q['mode']}, io {q.get('io', 'float')}"
        if calibration:
            head += f", calibrated on {calibration['batches']} batch(es) from {calibration['source']}"
        lines = [head]
        if calibration and calibration.get("random"):
            lines.append("  the calibration data was random: no evidence of accuracy on real inputs (give --calibration)")
        if "kept_float32" in q:
            kept = q["kept_float32"]
            shown = ", ".join(f"{k['op_type']} {k['node']}" for k in kept[:5]) + (", ..." if len(kept) > 5 else "")
            lines.append(f"  {q['ops'] - len(kept)} of {q['ops']} op(s) in float16; kept float32: {shown or 'none'}"
                         f"{' (quantization.kept_float32 says why)' if kept else ''}")
        if q.get("float_ops"):
            first = q["float_ops"][0]
            lines.append(f"  {len(q['float_ops'])} float op(s), first {first['node']} ({first['op_type']})")
        if q.get("spec_violations"):
            lines.append(f"  {len(q['spec_violations'])} departure(s) from the int8 spec, first: "
                         f"{q['spec_violations'][0]['message']}")
        collapse = q.get("first_collapse")
        if collapse:
            sqnr = "not finite" if collapse["sqnr_db"] is None else f"{collapse['sqnr_db']:.1f} dB"
            lines.append(f"  first layer to collapse: {collapse['tensor']} ({collapse['op_type']}), SQNR {sqnr}")
        return lines

    def summary_lines(self) -> list[str]:
        """A short human summary: the verdict first, then one line per failure. Bad input or
        usage (exit 2: nothing was judged) is one `exportgate: error:` line per failure, like
        every other error."""
        if self.exit_code in (2, 130, 143):
            return [f"exportgate: error: {f.message}" for f in self.failures if EXIT_CODES[f.kind] == self.exit_code]
        what = self.artifact.path if self.artifact else (self.model or "")
        detail = []
        if self.format:
            detail.append(self.format)
        if self.actual_opset is not None:
            detail.append(f"opset {self.actual_opset}")
        if self.exporter:
            detail.append(self.exporter)
        if self.target:
            detail.append(f"target {self.target}")
        head = f"{self.verdict.upper()} {what}"
        if detail:
            head += f" ({', '.join(detail)})"
        lines = [head]
        if self.command == "export" and not self.verified and not self.failures:
            lines.append("  not verified (--no-verify)")
        passed = [o for o in self.outputs if o.passed]
        if passed and not self.failures:
            lines.append(self._passed_line(passed))
        if self.data.get("outputs") and not self.failures:
            lines.append(self._data_line())
        if self.arithmetic and not self.failures:
            computed = "; ".join(f"{variant} run in {what.split(':')[0]}" for variant, what in self.arithmetic.items())
            exercised = "float16" in self.arithmetic
            lines.append(f"  {'float16 arithmetic exercised' if exercised else 'computed'}: {computed}")
        if self.quantization.get("mode") not in (None, "float"):
            lines.extend(self._quantization_lines())
        if self.dynamic and not self.failures:
            checked = [d for d in self.dynamic if d["status"] == "pass"]
            if checked:
                lines.append("  dynamic axes hold at other sizes: " + "; ".join(_held(checked)))
            for entry in self.dynamic:
                if entry["status"] == "skipped":
                    lines.append(f"  {entry['input']} axis {entry['axis']} not checked at other sizes: {entry['detail']}")
        if self.generation and not self.failures:
            steps = self.generation["steps"]
            on = f" on the {self.generation['prompts']} prompt(s) of the data" if "prompts" in self.generation else ""
            past = "" if on else f" (past length {steps[1]['past_length']} to {steps[-1]['past_length']})"
            lines.append(f"  generates as transformers' generate does{on}: prefill and {len(steps) - 1} cached decode "
                         f"step(s){past}, same tokens, logits max abs err {max(s['max_abs_err'] for s in steps):.3g}")
        if self.gelu_guard.startswith("off"):
            lines.append(f"  GELU guard {self.gelu_guard}")
        if self.gelu and not any(f.kind == "gelu" for f in self.failures):
            judged = [g for g in self.gelu if g["status"] not in ("unused", "indistinguishable")]
            unused = sum(g["status"] == "unused" for g in self.gelu)
            unresolved = [g for g in self.gelu if g["status"] == "indistinguishable"]
            kept = [g for g in judged if g["status"] != "declared"]
            declared = [g for g in judged if g["status"] == "declared"]
            flavours = sorted({g["source_flavour"] for g in kept if g["source_flavour"]})
            if kept or not (declared or unresolved):
                lines.append(f"  {len(kept)} GELU site(s) keep their flavour ({', '.join(flavours)})"
                             + (f"; {unused} unused (no output depends on them), not judged" if unused else ""))
            if declared:
                changes = sorted({f"{g['source_flavour']} to {g['measured']}" for g in declared})
                lines.append(f"  {len(declared)} GELU site(s) changed as declared ({', '.join(changes)})"
                             + (f"; {unused} unused (no output depends on them), not judged"
                                if unused and not kept else ""))
            if unresolved:
                steps = ", ".join(f"{g['resolution']:.2g}" for g in unresolved if g.get("resolution") is not None)
                lines.append(f"  {len(unresolved)} GELU site(s) whose flavour int8 cannot resolve"
                             + (f" (output step {steps})" if steps else "") + ": neither kept nor changed")
        source_off = [o for o in self.gelu_configured.get("off", ()) if o["side"] == "source"]
        if source_off:
            declared = ", ".join(f"{key} {d['name']} ({d['flavour']})"
                                 for key, d in self.gelu_configured["declared"].items())
            lines.append(f"  {len(source_off)} source GELU site(s) compute another flavour than the config declares "
                         f"({declared}): " + ", ".join(f"{o['site']} is {o['flavour']}" for o in source_off))
        for finding in self.failures:
            lines.append(f"  [{finding.kind}] {finding.message}")
        if self.divergence.get("message"):
            lines.append(f"  {self.divergence['message']}")
        if any("dynamic" in f.data for f in self.failures):
            lines.extend(f"  hint: {hint['message']}" for hint in self.dynamic_hints)
        if self.measurement:
            from verifiers.measurement import summary_lines

            lines.extend(summary_lines(self.measurement))
        if self.rejected_artifact:
            lines.append(f"  rejected artifact kept at {self.rejected_artifact}")
        if self.published_beside and self.exit_code == 0:
            lines.append(f"  published beside it: {', '.join(self.published_beside)}")
        return lines
