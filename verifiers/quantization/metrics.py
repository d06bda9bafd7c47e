"""How an integer (int8) artifact's outputs are judged: SQNR, cosine similarity, top-1 agreement.

Elementwise tolerances suit float artifacts; an int8 artifact is off by about one quantization
step everywhere, so it is judged the way int8 is judged: by its signal-to-quantization-noise
ratio (SQNR, in dB) over every batch and, where the output is class scores, by how often its
arg-max agrees with the source's. `quantize`/`dequantize` convert between real values and a
tensor's integers as TFLite's QUANTIZE and DEQUANTIZE kernels do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _pairs(refs: list[np.ndarray], arts: list[np.ndarray]):
    if len(refs) != len(arts):
        raise ValueError(f"{len(refs)} reference batch(es) against {len(arts)} artifact batch(es)")
    for ref, art in zip(refs, arts):
        ref64, art64 = np.asarray(ref, np.float64), np.asarray(art, np.float64)
        if ref64.shape != art64.shape:
            raise ValueError(f"shapes differ: reference {list(ref64.shape)}, artifact {list(art64.shape)}")
        yield ref64, art64


def sqnr_db(refs: list[np.ndarray], arts: list[np.ndarray]) -> float:
    """20·log10(‖ref‖ / ‖ref − art‖) over all batches together, in float64.

    math.inf when the two are identical (NaN/±Inf of the same kind at the same places count as
    identical); -math.inf when the reference is all zeros and the artifact is not, or when a
    NaN/±Inf stands on one side only (no finite signal-to-noise ratio describes that)."""
    signal = noise = 0.0
    for ref, art in _pairs(refs, arts):
        finite = np.isfinite(ref) & np.isfinite(art)
        same_nonfinite = (ref == art) | (np.isnan(ref) & np.isnan(art))
        if not np.all(finite | same_nonfinite):
            return -math.inf
        signal += float(np.sum(np.square(ref[finite])))
        noise += float(np.sum(np.square(ref[finite] - art[finite])))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def cosine(refs: list[np.ndarray], arts: list[np.ndarray]) -> float:
    """Cosine similarity of all batches flattened together: 1.0 when both are all zeros, 0.0 when
    one of them is; NaN when either holds a NaN or ±Inf."""
    dot = ref_norm = art_norm = 0.0
    for ref, art in _pairs(refs, arts):
        dot += float(np.dot(ref.ravel(), art.ravel()))
        ref_norm += float(np.dot(ref.ravel(), ref.ravel()))
        art_norm += float(np.dot(art.ravel(), art.ravel()))
    if ref_norm == 0.0 and art_norm == 0.0:
        return 1.0
    if ref_norm == 0.0 or art_norm == 0.0:
        return 0.0
    return dot / math.sqrt(ref_norm * art_norm)


# Output names that say the last axis is features, not classes (hidden states, embeddings).
FEATURE_NAME_PARTS = ("hidden", "embed", "feature", "pool", "state", "encod")


def looks_like_classes(shape: tuple[int, ...], dtype: np.dtype, name: str = "") -> bool:
    """The rule for top-1 agreement: a float output of rank 2 ([batch, classes]) or rank 3
    ([batch, sequence, vocabulary], e.g. a transformer's logits: arg-max per position) whose
    last axis has at least 2 entries and whose name does not mark it as features (contains none
    of FEATURE_NAME_PARTS, case-insensitive). Rank 1 is no batch of rows; rank 4 and up are
    images or feature maps, whose last axis is spatial or channels."""
    return (np.dtype(dtype).kind == "f" and len(shape) in (2, 3) and shape[-1] >= 2
            and not any(part in name.lower() for part in FEATURE_NAME_PARTS))


def top1_agreement(refs: list[np.ndarray], arts: list[np.ndarray], name: str = "") -> float | None:
    """The fraction of rows (every position but the last axis, over all batches) where the arg-max
    over the last axis agrees; None when the output does not look like classes (looks_like_classes
    on the reference's shape and dtype, and the output's name)."""
    if not refs or not looks_like_classes(np.shape(refs[0]), np.asarray(refs[0]).dtype, name):
        return None
    agree = rows = 0
    for ref, art in _pairs(refs, arts):
        agree += int(np.count_nonzero(np.argmax(ref, axis=-1) == np.argmax(art, axis=-1)))
        rows += math.prod(ref.shape[:-1])
    return agree / rows if rows else None


@dataclass(frozen=True)
class IntegerThresholds:
    """What an integer artifact's output must reach: SQNR in dB, and top-1 agreement where the
    output looks like classes."""

    min_sqnr_db: float = 20.0
    min_top1: float = 0.95


def judge_integer_output(name: str, refs: list[np.ndarray], arts: list[np.ndarray],
                         thresholds: IntegerThresholds) -> tuple[dict, str | None]:
    """{"sqnr_db", "cosine", "top1_agreement"} of one output (arts already dequantized to real
    values) and, when it falls short of the thresholds, a one-line message saying so."""
    metrics = {"sqnr_db": sqnr_db(refs, arts), "cosine": cosine(refs, arts),
               "top1_agreement": top1_agreement(refs, arts, name)}
    sqnr, top1 = metrics["sqnr_db"], metrics["top1_agreement"]
    failed = not sqnr >= thresholds.min_sqnr_db or (top1 is not None and top1 < thresholds.min_top1)
    if not failed:
        return metrics, None
    parts = [f"SQNR {sqnr:.1f} dB (min {thresholds.min_sqnr_db:g})"]
    if top1 is not None:
        parts.append(f"top-1 agreement {top1:.2f} (min {thresholds.min_top1:g})")
    parts.append(f"cosine {metrics['cosine']:.3f}")
    return metrics, f"output {name}: " + ", ".join(parts)


# ---- real values <-> a tensor's integers ---------------------------------------------------------


def _along(values, axis: int | None, ndim: int) -> np.ndarray:
    """Per-tensor values as they are; per-axis ones shaped to broadcast along `axis`."""
    values = np.asarray(values)
    if axis is None or values.size == 1:
        return values.reshape(())
    shape = [1] * ndim
    shape[axis] = values.size
    return values.reshape(shape)


def quantize(x: np.ndarray, scale, zero_point, dtype, axis: int | None = None) -> np.ndarray:
    """Real values to integers of `dtype` as TFLite's QUANTIZE kernel computes them on CPU: x times
    the float32 reciprocal of the scale, rounded half to even, plus the zero point, clamped to the
    dtype's range. (The reference kernel divides and rounds half away from zero, std::round; the
    optimized kernel the interpreter runs does that only for the last size % 8 elements, its
    vector loop multiplies by 1/scale and rounds to nearest even. Measured on ai-edge-litert's
    builtin kernels: this matches every element, on exact halfway inputs too; division with
    half-away rounding missed 33 of 64.) `scale`/`zero_point` are scalars, or one per slice along
    `axis` (per-axis)."""
    x = np.asarray(x, np.float32)
    inverse_scale = np.float32(1.0) / _along(scale, axis, x.ndim).astype(np.float32)
    zero_point = _along(zero_point, axis, x.ndim).astype(np.int64)
    info = np.iinfo(dtype)
    return np.clip(np.rint(x * inverse_scale).astype(np.int64) + zero_point, info.min, info.max).astype(dtype)


def dequantize(q: np.ndarray, scale, zero_point, axis: int | None = None) -> np.ndarray:
    """Integers to real values, (q − zero_point) · scale, in float32 as TFLite's DEQUANTIZE;
    `scale`/`zero_point` are scalars, or one per slice along `axis` (per-axis)."""
    q = np.asarray(q)
    scale = _along(scale, axis, q.ndim).astype(np.float32)
    zero_point = _along(zero_point, axis, q.ndim).astype(np.int64)
    return ((q.astype(np.int64) - zero_point).astype(np.float32) * scale).astype(np.float32)
