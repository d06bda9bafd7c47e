"""Which catalogued flavour do measured outputs compute? Probes, tolerances and `classify`.

`classify` names the flavour a site computes from its outputs on `PROBES`, against the reference
curves of the catalogue's records. Probes come in two parts: the core (|x| <= 6), where the
flavours differ and the flavour is decided, and the tails (`tail_probes`, out to +-1e4 in float32
and to the overflow edge in float16), where every GELU flavour is max(x, 0) to float precision. A
site that returns NaN/Inf there, or a wrong tail value (a saturation bug, an overflowing x^3), is
`unknown` with the tail named. A flavour is also recognised up to a constant scale (k * GELU, as
when a converter folds GELU's 0.5 into the next linear op): the classification reports the scale;
whether it is accounted for is the verdict's question.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from .catalogue import FLAVOURS, GELU_FAMILY, SCALABLE, UNKNOWN

# Where the flavours differ most (see the catalogue's docstring), the negative tail down to -6
# (where float32 exact GELU loses relative accuracy) and a few generic points.
PROBES = np.array(
    [-6.0, -5.0, -4.0, -3.0, -2.7, -2.27, -1.84, -1.5, -1.0, -0.75, -0.5, -0.25,
     0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 1.84, 2.27, 2.7, 3.0, 4.0, 6.0]
)
CORE_LIMIT = 6.0  # |x| above this is tail: every GELU flavour is max(x, 0) there
# Where field bugs live: tanh-GELU kernels returning NaN below -13, x^3 overflowing, saturation.
_TAILS = (10.0, 13.0, 20.0, 100.0, 1e3, 1e4)
_FLOAT16_TAILS = (*_TAILS, 3e4, 6e4)  # float16 overflows at 65504 (x^3 already at |x| > 40)


def tail_probes(dtype: np.dtype | type = np.float32) -> np.ndarray:
    """Tail probe inputs for a dtype: +-1e4 for float32/float64, to the overflow edge for float16."""
    tails = _FLOAT16_TAILS if np.dtype(dtype) == np.float16 else _TAILS
    return np.array([-t for t in reversed(tails)] + list(tails))


def probe_inputs(dtype: np.dtype | type = np.float32) -> np.ndarray:
    """Core probes and tail probes together, in the given dtype."""
    return np.concatenate([PROBES, tail_probes(dtype)]).astype(dtype)


# Match tolerances (max abs residual) for outputs computed in a given precision.
# float32: onnxruntime's float32 GELUs (fused ops and chains) land within 2.7e-7 of their
# reference on PROBES (exact 1.5e-7, tanh 1.9e-7, quick 2.7e-7) and within 8.7e-7 on a dense
# [-6, 6] grid (about two output ulps near |y| = 5); exact via 1+erf in float32 can be off by
# 6.8e-7. The tanh formula with the 0.0447 typo is 8.7e-6 from true tanh on PROBES.
# 3e-6 sits >3x above every float32 error and ~3x below the typo, so the typo classifies as
# unknown, not tanh.
FLOAT32_TOLERANCE = 3e-6
# float16: onnxruntime float16 GELU kernels land within 1e-3 of their reference (quick 5e-4),
# which cannot separate exact from tanh (4.7e-4 apart) but does separate quick (2e-2 away).
FLOAT16_TOLERANCE = 5e-3
# A curve is GELU-shaped when it is this close to exact, tanh or quick: 2.5x the widest gap
# inside the GELU family (exact-quick 2.03e-2), well under relu (0.17) and SiLU (0.19).
GELU_SHAPE_TOLERANCE = 5e-2
# Tails: |y - max(x, 0)| within TAIL_ABS + TAIL_REL * |x| (float32 ulps at 1e4 are ~1e-3; quick is
# -4e-7 at x = -10). float16 outputs get float16 relative precision.
TAIL_ABS = 1e-5
TAIL_REL = {np.dtype(np.float16): 2e-3}
DEFAULT_TAIL_REL = 1e-5


@dataclass(frozen=True)
class Classification:
    """What a site's outputs say: flavour, residual per reference, and how sure that is.

    When not confident, flavour is only the nearest reference (or unknown); note says why.
    """

    flavour: str
    residuals: dict[str, float]
    confident: bool
    note: str
    scale: float = 1.0  # the site computes scale * flavour
    tail: str = ""  # what went wrong in the tails ("NaN at x=-20"), empty when they hold
    samples: tuple[tuple[float, float], ...] = ()  # (x, y) on the core probes, for plots
    # 8-bit table measurements (verifiers.gelu.int8): entries of the table differing from each flavour's.
    table_differences: dict[str, int] = field(default_factory=dict)


def residuals(x: np.ndarray, y: np.ndarray, scale: float = 1.0) -> dict[str, float]:
    """Max abs difference between y and scale * every reference flavour at x (NaN counts as inf)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"{y.size} outputs for {x.size} probe inputs")
    out = {}
    with np.errstate(all="ignore"):
        for f in FLAVOURS.values():
            if f.reference is not None:
                r = float(np.max(np.abs(y - scale * f.reference(x))))
                out[f.name] = r if math.isfinite(r) else math.inf
    return out


def is_gelu_shaped(res: dict[str, float]) -> bool:
    """Whether residuals put the curve within GELU_SHAPE_TOLERANCE of the GELU family."""
    return min(res[name] for name in GELU_FAMILY) <= GELU_SHAPE_TOLERANCE


def _best_scale(x: np.ndarray, y: np.ndarray) -> tuple[str, float] | None:
    """The scalable flavour and scale k minimising max |y - k * f| (least-squares k), if finite."""
    best = None
    with np.errstate(all="ignore"):
        for name in SCALABLE:
            f = FLAVOURS[name].reference(x)
            k = float(np.dot(y, f) / np.dot(f, f))
            if not math.isfinite(k) or abs(k) < 1e-6:
                continue
            r = float(np.max(np.abs(y - k * f)))
            if math.isfinite(r) and (best is None or r / abs(k) < best[2]):
                best = (name, k, r / abs(k))
    return None if best is None else (best[0], best[1])


def check_tails(x: np.ndarray, y: np.ndarray, flavour: str, scale: float = 1.0,
                dtype: np.dtype | None = None) -> str:
    """Empty when every tail value is finite and scale * flavour(x) to float precision; else what is off."""
    rel = TAIL_REL.get(np.dtype(dtype) if dtype is not None else None, DEFAULT_TAIL_REL)
    with np.errstate(all="ignore"):
        expected = scale * FLAVOURS[flavour].reference(x)
    for xv, yv, ev in zip(x, y, expected):
        if not math.isfinite(yv):
            return f"{'NaN' if math.isnan(yv) else 'Inf'} at x={xv:g}"
        if abs(yv - ev) > TAIL_ABS + rel * abs(scale * xv):
            return f"{yv:.6g} at x={xv:g} where {flavour} gives {ev:.6g}"
    return ""


def classify(x: np.ndarray, y: np.ndarray, tolerance: float = FLOAT32_TOLERANCE) -> Classification:
    """Name the flavour whose reference is nearest to y, or unknown.

    The flavour is decided on the core probes (|x| <= CORE_LIMIT). Within tolerance of one flavour:
    that flavour, confident. Within tolerance of several (float16 cannot separate exact from
    tanh): the nearest, not confident. Within tolerance of scale * a flavour (k != 1): that flavour
    with its scale. Within none but GELU-shaped: unknown, confident. Not GELU-shaped at all:
    unknown, not confident. Tail probes (|x| > CORE_LIMIT), when given, must be finite and
    on the flavour's curve (times the scale): otherwise the site is unknown with the tail named.
    """
    x = np.asarray(x).reshape(-1)
    y = np.asarray(y).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"{y.size} outputs for {x.size} probe inputs")
    xf, yf = x.astype(np.float64), y.astype(np.float64)
    core = np.abs(xf) <= CORE_LIMIT
    samples = tuple(zip(xf[core].tolist(), yf[core].tolist()))
    result = replace(_classify_core(xf[core], yf[core], tolerance), samples=samples)
    if not core.all() and result.flavour != UNKNOWN:
        tail = check_tails(xf[~core], yf[~core], result.flavour, result.scale, y.dtype)
        if tail:
            return Classification(UNKNOWN, result.residuals, True,
                                  f"{result.flavour} on the core probes, but the tail is off: {tail}",
                                  result.scale, tail, samples)
    return result


def _classify_core(x: np.ndarray, y: np.ndarray, tolerance: float) -> Classification:
    res = residuals(x, y)
    ranked = sorted(res, key=res.get)
    best = ranked[0]
    matching = [name for name in ranked if res[name] <= tolerance]
    if len(matching) == 1:
        return Classification(best, res, True, f"{best} within {res[best]:.2g} (tolerance {tolerance:.2g})")
    if matching:
        return Classification(
            best, res, False,
            f"{' and '.join(matching)} all within tolerance {tolerance:.2g}: outputs cannot separate them",
        )
    scaled = _best_scale(x, y)
    if scaled is not None:
        name, k = scaled
        scaled_res = residuals(x, y, k)
        if scaled_res[name] <= tolerance * max(1.0, abs(k)):
            close = [n for n in SCALABLE if scaled_res[n] <= tolerance * max(1.0, abs(k))]
            return Classification(
                name, scaled_res, len(close) == 1,
                f"{k:.6g} x {name} within {scaled_res[name]:.2g} (tolerance {tolerance:.2g})", k)
    if is_gelu_shaped(res):
        return Classification(
            UNKNOWN, res, True,
            f"GELU-shaped but nearest flavour {best} is {res[best]:.2g} away (tolerance {tolerance:.2g})",
        )
    return Classification(UNKNOWN, res, False, f"not GELU-shaped: nearest flavour {best} is {res[best]:.2g} away")
