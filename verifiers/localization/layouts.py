"""How an artifact tensor holds a source tensor's values, and finding the source tensor an artifact
tensor holds by its values.

An artifact may keep a source tensor as it is, reshaped (a fully connected op on [batch*seq,
hidden]), or transposed (NHWC for NCHW, a key matrix stored transposed). A Layout is the source's
axes permuted, then reshaped to the artifact's shape. Where the two shapes are equal only the
identity is a layout: a tensor whose axes were swapped among equal sizes holds other values, not
the same ones laid out otherwise.

Matching by value goes through fingerprints (count, mean, mean |x|, extremes), which no layout
changes, before any element-wise comparison.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass

import numpy as np

MAX_LAYOUTS = 24
MATCH_RTOL = 1e-3  # a tensor holds a source tensor when no element is further than this x its scale


@dataclass(frozen=True)
class Layout:
    perm: tuple[int, ...]  # the source's axes, in the order the artifact holds them
    shape: tuple[int, ...]  # the artifact's shape

    @property
    def identity(self) -> bool:
        return self.perm == tuple(range(len(self.perm)))

    def to_artifact(self, source: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(source, self.perm)).reshape(self.shape)


def layouts(source_shape: tuple[int, ...], artifact_shape: tuple[int, ...],
            dialect: frozenset[tuple[int, ...]] = frozenset()) -> list[Layout]:
    """Ways the artifact's shape can hold the source's values, the identity (a plain reshape)
    first, then permutations of the source's axes that reshape naturally (dimensions merged or
    split, never cut across) into the artifact's, fewest axes moved first. Axes of equal size keep
    their order: holding them swapped is holding other values (a transpose that swaps the batch and
    the heads of a batch of two with two heads is a fault, not a layout). Where the shapes are
    equal, only the identity and the permutations of the artifact's `dialect` (those it holds
    other tensors in, unambiguously: NHWC for NCHW) are layouts."""
    source_shape, artifact_shape = tuple(source_shape), tuple(artifact_shape)
    if math.prod(source_shape) != math.prod(artifact_shape):
        return []
    identity = Layout(tuple(range(len(source_shape))), artifact_shape)
    if source_shape == artifact_shape:
        return [identity] + [Layout(perm, artifact_shape) for perm in sorted(dialect)
                             if len(perm) == len(source_shape) and perm != identity.perm
                             and tuple(source_shape[i] for i in perm) == artifact_shape]
    found = [identity] if _reshapes(source_shape, artifact_shape) else []
    axes = [i for i, d in enumerate(source_shape) if d != 1]
    units = [i for i, d in enumerate(source_shape) if d == 1]
    if len(axes) > 6:
        return found
    target = [d for d in artifact_shape if d != 1]
    seen = {tuple(source_shape[i] for i in axes)}
    for order in itertools.permutations(axes):  # axes of equal size keep their order: the first order giving
        dims = tuple(source_shape[i] for i in order)  # a sequence of sizes stands for every other giving it
        if dims in seen:
            continue
        seen.add(dims)
        if _reshapes(dims, tuple(target)):
            found.append(Layout(tuple(order) + tuple(units), artifact_shape))
    found[1:] = sorted(found[1:], key=lambda layout: sum(a != b for a, b in zip(layout.perm, range(99))))
    return found[:MAX_LAYOUTS]


def _reshapes(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether one shape is the other with dimensions merged or split, never a dimension cut
    across another's boundary (the running products of both refine each other)."""
    cuts = sorted({*itertools.accumulate((d for d in a if d != 1), operator.mul),
                   *itertools.accumulate((d for d in b if d != 1), operator.mul)})
    previous = 1
    for cut in cuts:
        if cut % previous:
            return False
        previous = cut
    return True


SATURATED = 1e30  # beyond this a value stands for an infinity (exporters write float32's lowest for -inf masks)


def max_abs(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |actual - expected| over the positions both hold finite values; inf where they
    disagree on a NaN or an infinity (a magnitude past SATURATED counts as the infinity of its sign)."""
    actual = _saturated(np.asarray(actual, np.float64))
    expected = _saturated(np.asarray(expected, np.float64))
    if actual.shape != expected.shape:
        actual = actual.reshape(expected.shape)
    finite = np.isfinite(actual) & np.isfinite(expected)
    same_kind = (np.isnan(actual) == np.isnan(expected)) & ((actual == expected) | finite)
    if not np.all(same_kind):
        return math.inf
    return float(np.abs(actual[finite] - expected[finite]).max()) if finite.any() else 0.0


def _saturated(values: np.ndarray) -> np.ndarray:
    big = np.abs(values) >= SATURATED
    return np.where(big, np.copysign(np.inf, values), values) if big.any() else values


def scale(value: np.ndarray) -> float:
    """A tensor's size for relative comparisons: its largest finite magnitude (at least float32's tiny)."""
    finite = np.abs(_ordinary(value))
    return max(float(finite.max()) if finite.size else 0.0, float(np.finfo(np.float32).tiny))


def _ordinary(value: np.ndarray) -> np.ndarray:
    """The values that are finite and not saturated, flattened."""
    values = np.asarray(value, np.float64).ravel()
    return values[np.isfinite(values) & (np.abs(values) < SATURATED)]


def best_layout(source: np.ndarray, artifact: np.ndarray, candidates: list[Layout] | None = None,
                dialect: frozenset[tuple[int, ...]] = frozenset()) -> tuple[Layout, float] | None:
    """The layout under which `artifact` is closest to `source`, and the max abs error there."""
    candidates = layouts(source.shape, artifact.shape, dialect) if candidates is None else candidates
    best = None
    for layout in candidates:
        error = max_abs(artifact, layout.to_artifact(source))
        if best is None or error < best[1]:
            best = (layout, error)
        if error == 0.0:
            break
    return best


@dataclass(frozen=True)
class Fingerprint:
    size: int
    extremes: tuple[int, int, int]  # how many NaN, -inf (or saturated) and +inf
    mean: float
    mean_abs: float
    low: float
    high: float

    @classmethod
    def of(cls, value: np.ndarray) -> Fingerprint:
        all_values = np.asarray(value, np.float64).ravel()
        extremes = (int(np.isnan(all_values).sum()), int((all_values <= -SATURATED).sum()),
                    int((all_values >= SATURATED).sum()))
        values = _ordinary(all_values)
        if not values.size:
            return cls(int(all_values.size), extremes, 0.0, 0.0, 0.0, 0.0)
        return cls(int(all_values.size), extremes, float(values.mean()), float(np.abs(values).mean()),
                   float(values.min()), float(values.max()))

    def near(self, other: Fingerprint, tolerance: float) -> bool:
        return self.size == other.size and self.extremes == other.extremes and all(
            abs(a - b) <= tolerance for a, b in ((self.mean, other.mean), (self.mean_abs, other.mean_abs),
                                                 (self.low, other.low), (self.high, other.high)))


class ValueIndex:
    """Source tensors found by value: `match(value)` gives the keys of those an artifact value
    holds under some layout, best first."""

    def __init__(self, tensors: dict[str, np.ndarray], dialect: frozenset[tuple[int, ...]] = frozenset()):
        self.values, self.dialect = tensors, dialect
        self.by_size: dict[int, list[tuple[str, Fingerprint, float]]] = {}
        for key, value in tensors.items():
            self.by_size.setdefault(int(value.size), []).append((key, Fingerprint.of(value), scale(value)))

    def match(self, value: np.ndarray, allowed=None) -> list[tuple[str, Layout, float]]:
        """(key, layout, max abs error) of every source tensor `value` holds within MATCH_RTOL of
        its scale, smallest error first; `allowed(key)` filters the candidates."""
        found = []
        mine = Fingerprint.of(value)
        for key, print_, size in self.by_size.get(int(value.size), ()):
            if allowed is not None and not allowed(key):
                continue
            tolerance = MATCH_RTOL * size
            if not mine.near(print_, tolerance):
                continue
            best = best_layout(self.values[key], value, dialect=self.dialect)
            if best is not None and best[1] <= tolerance:
                found.append((key, best[0], best[1]))
        return sorted(found, key=lambda item: item[2])
