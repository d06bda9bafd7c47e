"""The GELU flavour catalogue shared by every site matcher (ONNX, PyTorch, Keras, TFLite).

Each flavour has a float64 reference curve; `classify` names the flavour a site computes
from its outputs on `PROBES`. Distances between flavours (max |a - b| on [-10, 10]):
exact-tanh 4.73e-4 (x = +-2.70), tanh-"0.0447 typo" 8.7e-6 (x = +-1.84),
exact-quick 2.03e-2 (x = +-2.27), exact-relu 0.170 (x = +-0.75).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # tanh flavour: scale inside tanh, 0.7978845608
TANH_CUBIC_COEFF = 0.044715  # tanh flavour: coefficient of x**3
QUICK_ALPHA = 1.702  # quick flavour: x * sigmoid(QUICK_ALPHA * x)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)  # exact flavour: erf argument is x / sqrt(2)

EXACT = "exact"
TANH = "tanh"
QUICK = "quick"
RELU = "relu"
IDENTITY = "identity"
UNKNOWN = "unknown"

# Where the flavours differ most (see module docstring), the negative tail down to -6
# (where float32 exact GELU loses relative accuracy) and a few generic points.
PROBES = np.array(
    [-6.0, -5.0, -4.0, -3.0, -2.7, -2.27, -1.84, -1.5, -1.0, -0.75, -0.5, -0.25,
     0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 1.84, 2.27, 2.7, 3.0, 4.0, 6.0]
)

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


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def exact(x: np.ndarray) -> np.ndarray:
    """x * Phi(x) in float64."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + _erf(x * INV_SQRT_2))


def tanh(x: np.ndarray) -> np.ndarray:
    """The tanh approximation of GELU in float64."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + TANH_CUBIC_COEFF * x**3)))


def quick(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(1.702 x) in float64."""
    x = np.asarray(x, dtype=np.float64)
    return x * _sigmoid(QUICK_ALPHA * x)


def relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0) in float64."""
    return np.maximum(np.asarray(x, dtype=np.float64), 0.0)


def identity(x: np.ndarray) -> np.ndarray:
    """x in float64 (the activation is gone)."""
    return np.asarray(x, dtype=np.float64)


@dataclass(frozen=True)
class Flavour:
    """A catalogued flavour; `reference` is None for `unknown`."""

    name: str
    description: str
    reference: Callable[[np.ndarray], np.ndarray] | None


FLAVOURS: dict[str, Flavour] = {
    f.name: f
    for f in (
        Flavour(EXACT, "x*Phi(x) = 0.5x(1+erf(x/sqrt2))", exact),
        Flavour(TANH, "0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))", tanh),
        Flavour(QUICK, "x*sigmoid(1.702x)", quick),
        Flavour(RELU, "max(x, 0): a ReLU stands where a GELU was", relu),
        Flavour(IDENTITY, "x: the activation is gone", identity),
        Flavour(UNKNOWN, "GELU-shaped but matches no catalogued flavour (e.g. wrong constants)", None),
    )
}
GELU_FAMILY = (EXACT, TANH, QUICK)


@dataclass(frozen=True)
class Site:
    """One activation site found in a model, shared by all matchers.

    site_id is stable across runs ("{index}:{first node}", graph order); op describes what
    stands there ("Gelu", "com.microsoft.FastGelu", "erf-chain", ...); claimed is the
    flavour the structure says; nodes are the covered nodes (Constant nodes left out, as
    they may be shared); input/output are the tensors
    around the site, so it can be measured; note explains the claim (attributes, constants).
    """

    site_id: str
    op: str
    claimed: str
    nodes: tuple[str, ...]
    input: str
    output: str
    note: str = ""


@dataclass(frozen=True)
class Classification:
    """What a site's outputs say: flavour, residual per reference, and how sure that is.

    When not confident, flavour is only the nearest reference (or unknown); note says why.
    """

    flavour: str
    residuals: dict[str, float]
    confident: bool
    note: str


def residuals(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Max abs difference between y and every reference flavour at x (NaN counts as inf)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"{y.size} outputs for {x.size} probe inputs")
    out = {}
    for f in FLAVOURS.values():
        if f.reference is not None:
            r = float(np.max(np.abs(y - f.reference(x))))
            out[f.name] = r if math.isfinite(r) else math.inf
    return out


def is_gelu_shaped(res: dict[str, float]) -> bool:
    """Whether residuals put the curve within GELU_SHAPE_TOLERANCE of the GELU family."""
    return min(res[name] for name in GELU_FAMILY) <= GELU_SHAPE_TOLERANCE


def classify(x: np.ndarray, y: np.ndarray, tolerance: float = FLOAT32_TOLERANCE) -> Classification:
    """Name the flavour whose reference is nearest to y, or unknown.

    Within tolerance of one flavour: that flavour, confident. Within tolerance of several
    (float16 cannot separate exact from tanh): the nearest, not confident. Within none but
    GELU-shaped: unknown, confident. Not GELU-shaped at all: unknown, not confident.
    """
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
    if is_gelu_shaped(res):
        return Classification(
            UNKNOWN, res, True,
            f"GELU-shaped but nearest flavour {best} is {res[best]:.2g} away (tolerance {tolerance:.2g})",
        )
    return Classification(UNKNOWN, res, False, f"not GELU-shaped: nearest flavour {best} is {res[best]:.2g} away")
