"""Error statistics per sample, gathered batch by batch (the data check, --data): for each output,
every sample's max abs and mean abs error, SQNR and cosine, and for outputs over classes its top-1
and top-5 agreement; each summed up as the mean over samples, the worst value and the worst
sample's number. Nothing of a batch is kept once it is counted, so memory does not grow with the
samples.

Verdicts: a float artifact fails an output where a sample has an element outside atol + rtol·|ref|
(as on the seeded batches); an integer one where the SQNR over all samples, or the top-1
agreement, falls below its thresholds (verifiers.quantization.metrics). The finding names the
output, the statistic, the worst sample and its value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verifiers.compare import Tolerance
from verifiers.quantization.metrics import IntegerThresholds, cosine, looks_like_classes, sqnr_db
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
        and are not counted); an output without a row per sample counts as its first sample."""
        if ref.shape != art.shape:
            self.shape_differs = self.shape_differs or (list(ref.shape), list(art.shape))
            return
        if ref.ndim == 0 or ref.shape[0] < len(numbers):
            self._sample(ref.astype(np.float64), art.astype(np.float64), numbers[0])
            return
        for row, number in enumerate(numbers):
            self._sample(ref[row].astype(np.float64), art[row].astype(np.float64), number)

    def _sample(self, ref: np.ndarray, art: np.ndarray, sample: int) -> None:
        self.samples += 1
        same_nonfinite = (ref == art) | (np.isnan(ref) & np.isnan(art))
        finite = np.isfinite(ref) & np.isfinite(art)
        diff = np.where(finite, np.abs(art - ref), np.where(same_nonfinite, 0.0, np.inf))
        outside = diff > self.tolerance.atol + self.tolerance.rtol * np.where(finite, np.abs(ref), 0.0)
        if outside.any():
            self.failing_samples += 1
            if len(self.failing) < FAILING_LISTED:
                self.failing.append(sample)
        self.max_abs.add(float(diff.max()) if diff.size else 0.0, sample)
        self.by_sample.add(float(diff.max()) if diff.size else 0.0)
        self.mean_abs.add(float(diff.mean()) if diff.size else 0.0, sample)
        self.sqnr_db.add(sqnr_db([ref], [art]), sample)
        self.cosine.add(cosine([ref], [art]), sample)
        self.signal += float(np.sum(np.square(ref[finite])))
        self.noise += float(np.sum(np.square(ref[finite] - art[finite])))
        if looks_like_classes((1, *ref.shape), ref.dtype, self.name):
            expected = np.argmax(ref, axis=-1)
            self.top1.add(float(np.mean(expected == np.argmax(art, axis=-1))), sample)
            if ref.shape[-1] >= 5:
                top = np.argpartition(-art, 4, axis=-1)[..., :5]
                self.top5.add(float(np.mean(np.any(top == expected[..., None], axis=-1))), sample)

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

    def finding(self, where: str, integer: IntegerThresholds | None) -> Finding | None:
        """Why this output fails on the data (None: it passes)."""
        head = f"output {self.name}{'' if self.variant is None else f' ({self.variant})'} on {where}"
        data = {"cause": VALUES, "variant": self.variant, "data": True}
        if self.shape_differs:
            ref, art = self.shape_differs
            return Finding("numeric", f"{head}: shape differs, source {ref} vs artifact {art}", output=self.name,
                           data={**data, "cause": "shape"})
        worst = self.max_abs
        data.update(max_abs_err=worst.worst, sample=worst.worst_sample)
        if integer is not None:
            overall, top1 = self.overall_sqnr_db, self.top1.record()["mean"] if self.top1.worst is not None else None
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
