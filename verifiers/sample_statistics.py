"""Error statistics per sample, gathered batch by batch (the data check, --data): for each output,
every sample's max abs and mean abs error, SQNR and cosine, and for outputs over classes its top-1
and top-5 agreement; each summed up as the mean over samples, the worst value and the worst
sample's number. Nothing of a batch is kept once it is counted, so memory does not grow with the
samples.

Verdicts: a float artifact fails an output where a sample has an element outside atol + rtol·|ref|
(as on the seeded batches); an integer one where the SQNR over all samples, or the top-1
agreement, falls below its thresholds (verifiers.quantization.metrics). Floors given on the command
line (`Floors`: --min-sqnr, --min-cosine, --min-top1) hold any artifact besides: the worst sample's
SQNR and cosine, the top-1 agreement over the samples. Each finding names the output, the
statistic, the worst sample and its value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verifiers.compare import Tolerance
from verifiers.quantization.metrics import IntegerThresholds, looks_like_classes
from verifiers.report import VALUES, Finding


FAILING_LISTED = 20  # samples out of tolerance listed by number in the report, per output
SERIES_POINTS = 1000  # at most this many points of each output's max abs error by sample


@dataclass
class Series:
    """A value per sample, in order, kept to at most SERIES_POINTS points: when full, neighbouring
    points merge (their worst kept) and each point stands for twice as many samples."""

    per_point: int = 1
    points: list[float] = field(default_factory=list)
    _in_last: int = 0

    def add(self, value: float) -> None:
        if self.points and self._in_last < self.per_point:
            self.points[-1] = max(self.points[-1], value)
            self._in_last += 1
            return
        self.points.append(value)
        self._in_last = 1
        if len(self.points) > SERIES_POINTS:
            merged = [max(self.points[k:k + 2]) for k in range(0, len(self.points), 2)]
            self._in_last = self._in_last + (self.per_point if len(self.points) % 2 == 0 else 0)
            self.points, self.per_point = merged, 2 * self.per_point

    def record(self) -> dict[str, Any]:
        return {"samples_per_point": self.per_point, "points": self.points}


@dataclass
class Statistic:
    """One statistic over samples: its mean, its worst value and the sample that has it."""

    lower_is_worse: bool = False
    total: float = 0.0
    counted: int = 0
    worst: float | None = None
    worst_sample: int | None = None

    def add(self, value: float | None, sample: int) -> None:
        if value is None or math.isnan(value):
            return
        if math.isfinite(value):
            self.total += value
            self.counted += 1
        if self.worst is None or (value < self.worst if self.lower_is_worse else value > self.worst):
            self.worst, self.worst_sample = value, sample

    def record(self) -> dict[str, Any]:
        return {"mean": self.total / self.counted if self.counted else None,
                "worst": self.worst if self.worst is None or math.isfinite(self.worst) else None,
                "worst_sample": self.worst_sample}


@dataclass(frozen=True)
class Floors:
    """The lowest statistics over samples the user allows, None where not given: the worst
    sample's SQNR (dB) and cosine, and the top-1 agreement over the samples."""

    min_sqnr_db: float | None = None
    min_cosine: float | None = None
    min_top1: float | None = None


@dataclass
class OutputStatistics:
    """Everything counted of one output (`name`) of one way of running the artifact (`variant`)."""

    name: str
    variant: str | None  # the runtime's way of running it, where it has several (LiteRT: xnnpack, builtin)
    tolerance: Tolerance
    max_abs: Statistic = field(default_factory=Statistic)
    mean_abs: Statistic = field(default_factory=Statistic)
    sqnr_db: Statistic = field(default_factory=lambda: Statistic(lower_is_worse=True))
    cosine: Statistic = field(default_factory=lambda: Statistic(lower_is_worse=True))
    top1: Statistic = field(default_factory=lambda: Statistic(lower_is_worse=True))
    top5: Statistic = field(default_factory=lambda: Statistic(lower_is_worse=True))
    samples: int = 0
    failing_samples: int = 0
    failing: list[int] = field(default_factory=list)  # the first FAILING_LISTED samples out of tolerance
    by_sample: Series = field(default_factory=Series)  # max abs error, sample by sample
    signal: float = 0.0  # sums of squares over every sample: the SQNR of all of them together
    noise: float = 0.0
    shape_differs: tuple[list[int], list[int]] | None = None

    def add(self, ref: np.ndarray, art: np.ndarray, numbers: list[int]) -> None:
        """A batch's outputs, its first rows the samples `numbers` (the rest fill a static batch
        and are not counted); an output without a row per sample counts as its first sample. Every
        statistic is taken row by row at once."""
        if ref.shape != art.shape:
            self.shape_differs = self.shape_differs or (list(ref.shape), list(art.shape))
            return
        per_row = ref.ndim > 0 and ref.shape[0] >= len(numbers)
        if not per_row:
            numbers = numbers[:1]
        rows = len(numbers)
        shape = ref.shape[1:] if per_row else ref.shape
        ref = (ref[:rows] if per_row else ref[None]).reshape(rows, -1).astype(np.float64)
        art = (art[:rows] if per_row else art[None]).reshape(rows, -1).astype(np.float64)
        self.samples += rows
        finite = np.isfinite(ref) & np.isfinite(art)
        same_nonfinite = (ref == art) | (np.isnan(ref) & np.isnan(art))
        ref_f, art_f = np.where(finite, ref, 0.0), np.where(finite, art, 0.0)
        diff = np.where(finite, np.abs(art_f - ref_f), np.where(same_nonfinite, 0.0, np.inf))
        outside = (diff > self.tolerance.atol + self.tolerance.rtol * np.abs(ref_f)).any(axis=1)
        empty = diff.shape[1] == 0
        max_abs = np.zeros(rows) if empty else diff.max(axis=1)
        mean_abs = np.zeros(rows) if empty else diff.mean(axis=1)
        signal = np.square(ref_f).sum(axis=1)
        noise = np.square(ref_f - art_f).sum(axis=1)
        mismatched = ~(finite | same_nonfinite).all(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            sqnr = np.where(noise == 0, np.inf, 10.0 * np.log10(signal / noise))
        sqnr = np.where(mismatched, -np.inf, sqnr)
        dot, ref_norm, art_norm = (ref * art).sum(axis=1), np.square(ref).sum(axis=1), np.square(art).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            cos = dot / np.sqrt(ref_norm * art_norm)
        cos = np.where((ref_norm == 0) & (art_norm == 0), 1.0, np.where((ref_norm == 0) | (art_norm == 0), 0.0, cos))
        self.signal += float(signal.sum())
        self.noise += float(noise.sum())
        classes = looks_like_classes((1, *shape), ref.dtype, self.name) if shape else False
        if classes:
            ref_c, art_c = ref.reshape(rows, -1, shape[-1]), art.reshape(rows, -1, shape[-1])
            expected = np.argmax(ref_c, axis=-1)
            top1 = (expected == np.argmax(art_c, axis=-1)).mean(axis=1)
            if shape[-1] >= 5:
                top = np.argpartition(-art_c, 4, axis=-1)[..., :5]
                top5 = np.any(top == expected[..., None], axis=-1).mean(axis=1)
        for row, number in enumerate(numbers):
            if outside[row]:
                self.failing_samples += 1
                if len(self.failing) < FAILING_LISTED:
                    self.failing.append(number)
            self.max_abs.add(float(max_abs[row]), number)
            self.by_sample.add(float(max_abs[row]))
            self.mean_abs.add(float(mean_abs[row]), number)
            self.sqnr_db.add(float(sqnr[row]), number)
            self.cosine.add(float(cos[row]), number)
            if classes:
                self.top1.add(float(top1[row]), number)
                if shape[-1] >= 5:
                    self.top5.add(float(top5[row]), number)

    @property
    def overall_sqnr_db(self) -> float:
        """The SQNR of every sample together: inf when identical."""
        if self.noise == 0.0:
            return math.inf
        return 10.0 * math.log10(self.signal / self.noise) if self.signal else -math.inf

    def record(self) -> dict[str, Any]:
        stats = {"max_abs": self.max_abs, "mean_abs": self.mean_abs, "sqnr_db": self.sqnr_db,
                 "cosine": self.cosine, "top1": self.top1, "top5": self.top5}
        overall = self.overall_sqnr_db
        return {"name": self.name, "variant": self.variant, "samples": self.samples,
                "atol": self.tolerance.atol, "rtol": self.tolerance.rtol,
                "samples_out_of_tolerance": self.failing_samples, "failing_samples": self.failing,
                "sqnr_db_all_samples": overall if math.isfinite(overall) else None,
                "max_abs_by_sample": self.by_sample.record(),
                **{key: stat.record() for key, stat in stats.items() if stat.worst is not None}}

    @property
    def top1_mean(self) -> float | None:
        """The top-1 agreement over the samples (None: the output is not over classes)."""
        return self.top1.record()["mean"] if self.top1.worst is not None else None

    def _head(self, where: str) -> str:
        return f"output {self.name}{'' if self.variant is None else f' ({self.variant})'} on {where}"

    def findings(self, where: str, integer: IntegerThresholds | None, floors: Floors = Floors()) -> list[Finding]:
        """Why this output fails on the data (none: it passes): its tolerances or thresholds, then
        each floor it falls below."""
        head = self._head(where)
        data = {"cause": VALUES, "variant": self.variant, "data": True}
        if self.shape_differs:
            ref, art = self.shape_differs
            return [Finding("numeric", f"{head}: shape differs, source {ref} vs artifact {art}", output=self.name,
                            data={**data, "cause": "shape"})]
        data.update(max_abs_err=self.max_abs.worst, sample=self.max_abs.worst_sample)
        found = self._judged(head, data, integer)
        return ([] if found is None else [found]) + self.below_floors(where, floors)

    def below_floors(self, where: str, floors: Floors) -> list[Finding]:
        """A finding for each floor a statistic falls below."""
        head = self._head(where)
        data = {"cause": VALUES, "variant": self.variant, "data": True, "max_abs_err": self.max_abs.worst}
        found = []
        for statistic, floor, name in ((self.sqnr_db, floors.min_sqnr_db, "sqnr_db"),
                                       (self.cosine, floors.min_cosine, "cosine")):
            if floor is None or statistic.worst is None or statistic.worst >= floor:
                continue
            label, unit = ("SQNR", " dB") if name == "sqnr_db" else ("cosine", "")
            value = f"{statistic.worst:.1f}" if name == "sqnr_db" else f"{statistic.worst:.6f}"
            found.append(Finding("numeric", f"{head}: {label} {value}{unit} at worst, sample {statistic.worst_sample} "
                                            f"(min {floor:g}, --min-{'sqnr' if name == 'sqnr_db' else 'cosine'})",
                                 output=self.name,
                                 data={**data, "statistic": name, "sample": statistic.worst_sample,
                                       name: statistic.worst if math.isfinite(statistic.worst) else None}))
        top1 = self.top1_mean
        if floors.min_top1 is not None and top1 is not None and top1 < floors.min_top1:
            found.append(Finding("numeric", f"{head}: top-1 agreement {top1:.3f} over {self.samples} sample(s) (min "
                                            f"{floors.min_top1:g}, --min-top1), worst sample {self.top1.worst_sample}: "
                                            f"{self.top1.worst:.3f}", output=self.name,
                                 data={**data, "statistic": "top1", "sample": self.top1.worst_sample, "top1": top1}))
        return found

    def _judged(self, head: str, data: dict, integer: IntegerThresholds | None) -> Finding | None:
        """The tolerances' verdict (a float artifact) or the integer thresholds' (an int8 one)."""
        worst = self.max_abs
        if integer is not None:
            overall, top1 = self.overall_sqnr_db, self.top1_mean
            if overall >= integer.min_sqnr_db and (top1 is None or top1 >= integer.min_top1):
                return None
            low = self.sqnr_db
            parts = [f"SQNR {overall:.1f} dB over {self.samples} sample(s) (min {integer.min_sqnr_db:g})"]
            if top1 is not None:
                parts.append(f"top-1 agreement {top1:.3f} (min {integer.min_top1:g})")
            if low.worst_sample is not None:
                parts.append(f"worst sample {low.worst_sample}: SQNR {low.worst:.1f} dB")
            return Finding("numeric", f"{head}: " + ", ".join(parts), output=self.name,
                           data={**data, "statistic": "sqnr_db", "sample": low.worst_sample,
                                 "sqnr_db": overall if math.isfinite(overall) else None})
        if not self.failing_samples:
            return None
        value = "NaN/Inf where the source has a number" if math.isinf(worst.worst) else \
            f"max abs err {worst.worst:.3g}"
        return Finding("numeric", f"{head}: {self.failing_samples} of {self.samples} sample(s) out of tolerance "
                                  f"(atol {self.tolerance.atol:g}, rtol {self.tolerance.rtol:g}), worst sample "
                                  f"{worst.worst_sample}: {value}", output=self.name,
                       data={**data, "statistic": "max_abs", "samples_out_of_tolerance": self.failing_samples,
                             "max_abs_err": worst.worst if math.isfinite(worst.worst) else None})
