"""The GELU flavour catalogue: one `Flavour` record per flavour, read by every matcher, writer and policy.

A record holds what exportgate knows about a flavour: its name, the constants its formula is
written with, its float64 reference curve, the writer forms that write it
(`verifiers.formats.onnx.gelu_writer`, which the ONNX and TFLite rewrites run), the `approximate` value of
the ONNX Gelu-20 node that computes it (None when Gelu-20 cannot express it), and the fused or
framework ops that claim it (`Claim`: com.microsoft ops, the TFLite GELU builtin's approximate
flag, torch's aten.gelu approximate value, Keras' approximate flag). Lookups: `flavour(name)`,
`claimed_by(framework, op, attrs)`, `claim_for(name, framework, op)`, `gelu20_flavour(approximate)`.

Distances between the reference curves (max |a - b| on [-10, 10]): exact-tanh 4.73e-4
(x = +-2.70), tanh-"0.0447 typo" 8.7e-6 (x = +-1.84), exact-quick 2.03e-2 (x = +-2.27), exact-relu
0.170 (x = +-0.75), exact-silu 0.19. Measured outputs are classified against the curves in
`classification`.

Importing this module needs only the standard library (the fixture scripts read its names); the
reference curves import numpy when called.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any

EXACT = "exact"
TANH = "tanh"
QUICK = "quick"
RELU = "relu"
IDENTITY = "identity"
SILU = "silu"
UNKNOWN = "unknown"

# Families: what a flavour is to the guard.
GELU = "gelu"  # a GELU flavour: a site of its own, judged
ACTIVATION = "activation"  # another activation a GELU may turn into (a site of its own, not listed when kept)
REMOVED = "removed"  # no activation at all
UNCATALOGUED = "uncatalogued"  # GELU-shaped, but no flavour of the catalogue

# Writer forms (verifiers.formats.onnx.gelu_writer.FORMS is keyed (flavour, form)).
PRIMITIVES = "primitives"  # default-domain elementwise ops, opset 13+
GELU_OP = "gelu_op"  # one Gelu-20 node with the flavour's approximate attribute, opset 20+
ERF_FREE = "erf_free"  # primitives without Erf (erf as Abramowitz & Stegun 7.1.26)

# Frameworks a Claim names ops of (ONNX ops outside the default domain are "{domain}.{op_type}").
# TRANSFORMERS claims are the activation names a transformers config declares (hidden_act,
# activation_function, ...: the keys of transformers.activations.ACT2FN).
ONNX, TFLITE, TORCH, KERAS, TRANSFORMERS = "onnx", "tflite", "torch", "keras", "transformers"


@dataclass(frozen=True)
class Claim:
    """An op that says it computes a flavour: the framework, the op as that framework's site finder
    names it, the attribute values that make the claim, and the note a site claimed by it gets."""

    framework: str
    op: str
    attrs: tuple[tuple[str, Any], ...] = ()
    note: str = ""

    def attr(self, name: str) -> Any:
        return dict(self.attrs)[name]

    def matches(self, framework: str, op: str, attrs: Mapping[str, Any]) -> bool:
        return (framework, op) == (self.framework, self.op) and all(
            name in attrs and attrs[name] == value for name, value in self.attrs)


@dataclass(frozen=True, eq=False)
class Flavour:
    """One catalogued flavour (see the module docstring); `reference` is None for `unknown`.

    constants: the numbers its formula is written with, by the key writers and matchers use.
    forms: the writer forms that write it; no_erf_form: the one written where Erf cannot run
    (TFLite lowering, ONNX targets without Erf). scalable: recognised up to a constant scale.
    """

    name: str
    description: str
    reference: Callable[[Any], Any] | None
    family: str
    constants: Mapping[str, float] = field(default_factory=dict)
    scalable: bool = False
    forms: tuple[str, ...] = ()
    no_erf_form: str | None = None
    gelu20_approximate: str | None = None
    claims: tuple[Claim, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "constants", MappingProxyType(dict(self.constants)))
        if self.gelu20_approximate is not None and GELU_OP not in self.forms:
            raise ValueError(f"flavour {self.name}: Gelu-20 expresses it, but {GELU_OP!r} is not among its forms")
        if self.no_erf_form is not None and self.no_erf_form not in self.forms:
            raise ValueError(f"flavour {self.name}: no_erf_form {self.no_erf_form!r} is not among its forms")

    def constant(self, key: str) -> float:
        return self.constants[key]


# ---- reference curves (float64; numpy loads on the first call) ----------------------------------


def _np():
    import numpy

    return numpy


@cache
def _vectorized_erf():
    np = _np()
    return np.vectorize(math.erf, otypes=[np.float64])


def erf(x):
    """math.erf elementwise, in float64."""
    return _vectorized_erf()(x)


def _sigmoid(z):
    return 0.5 * (1.0 + _np().tanh(0.5 * z))


def exact(x):
    """x * Phi(x) in float64."""
    np = _np()
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + erf(x * INV_SQRT_2))


def tanh(x):
    """The tanh approximation of GELU in float64."""
    np = _np()
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + TANH_CUBIC_COEFF * x**3)))


def quick(x):
    """x * sigmoid(1.702 x) in float64."""
    np = _np()
    x = np.asarray(x, dtype=np.float64)
    return x * _sigmoid(QUICK_ALPHA * x)


def relu(x):
    """max(x, 0) in float64."""
    np = _np()
    return np.maximum(np.asarray(x, dtype=np.float64), 0.0)


def silu(x):
    """x * sigmoid(x) in float64 (SiLU / swish: a plausible swap for GELU)."""
    np = _np()
    x = np.asarray(x, dtype=np.float64)
    return x * _sigmoid(x)


def identity(x):
    """x in float64 (the activation is gone)."""
    np = _np()
    return np.asarray(x, dtype=np.float64)


# ---- the records ------------------------------------------------------------------------------

FLAVOURS: dict[str, Flavour] = {
    f.name: f
    for f in (
        Flavour(
            EXACT, "x*Phi(x) = 0.5x(1+erf(x/sqrt2))", exact, GELU,
            constants={"half": 0.5, "one": 1.0, "sqrt2": math.sqrt(2.0)},
            scalable=True, forms=(PRIMITIVES, GELU_OP, ERF_FREE), no_erf_form=ERF_FREE, gelu20_approximate="none",
            claims=(
                Claim(ONNX, "com.microsoft.Gelu", note="exact kernel"),
                Claim(ONNX, "com.microsoft.BiasGelu",
                      note="exact kernel (onnxruntime's optimizer writes it for tanh Gelu too)"),
                Claim(TFLITE, "GELU", (("approximate", False),)),  # also what no GeluOptions table reads as
                Claim(TORCH, "aten.gelu.default", (("approximate", "none"),)),
                Claim(KERAS, "gelu", (("approximate", False),)),
                Claim(TRANSFORMERS, "gelu"),
                Claim(TRANSFORMERS, "gelu_python"),
            ),
        ),
        Flavour(
            TANH, "0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))", tanh, GELU,
            constants={"half": 0.5, "one": 1.0, "tanh_scale": math.sqrt(2.0 / math.pi), "cubic": 0.044715},
            scalable=True, forms=(PRIMITIVES, GELU_OP), no_erf_form=PRIMITIVES, gelu20_approximate="tanh",
            claims=(
                Claim(ONNX, "com.microsoft.FastGelu", note="tanh kernel"),
                Claim(TFLITE, "GELU", (("approximate", True),)),
                Claim(TORCH, "aten.gelu.default", (("approximate", "tanh"),)),
                Claim(KERAS, "gelu", (("approximate", True),)),
                Claim(TRANSFORMERS, "gelu_new"),
                Claim(TRANSFORMERS, "gelu_pytorch_tanh"),
                Claim(TRANSFORMERS, "gelu_python_tanh"),
                Claim(TRANSFORMERS, "gelu_fast", note="the tanh formula with sqrt(2/pi) multiplied in"),
                Claim(TRANSFORMERS, "gelu_accurate"),
            ),
        ),
        Flavour(
            QUICK, "x*sigmoid(1.702x)", quick, GELU,
            constants={"quick_alpha": 1.702},
            scalable=True, forms=(PRIMITIVES,), no_erf_form=PRIMITIVES,
            claims=(Claim(ONNX, "com.microsoft.QuickGelu"),  # when its alpha attribute is quick_alpha
                    Claim(TRANSFORMERS, "quick_gelu")),
        ),
        Flavour(RELU, "max(x, 0): a ReLU stands where a GELU was", relu, ACTIVATION,
                forms=(PRIMITIVES,), no_erf_form=PRIMITIVES, claims=(Claim(TRANSFORMERS, "relu"),)),
        Flavour(IDENTITY, "x: the activation is gone", identity, REMOVED, forms=(PRIMITIVES,), no_erf_form=PRIMITIVES),
        Flavour(SILU, "x*sigmoid(x): a SiLU stands where a GELU was", silu, ACTIVATION, scalable=True,
                claims=(Claim(TRANSFORMERS, "silu"), Claim(TRANSFORMERS, "swish"))),
        Flavour(UNKNOWN, "GELU-shaped but matches no catalogued flavour (e.g. wrong constants)", None, UNCATALOGUED),
    )
}

GELU_FAMILY = tuple(f.name for f in FLAVOURS.values() if f.family == GELU)
# Activations that are sites of their own: aligned with GELU sites (a GELU may turn into one),
# not listed when kept.
OTHER_ACTIVATIONS = tuple(f.name for f in FLAVOURS.values() if f.family == ACTIVATION)
# Flavours recognised up to a constant scale.
SCALABLE = tuple(f.name for f in FLAVOURS.values() if f.scalable)
# The constants by name, read from the records.
SQRT_2_OVER_PI = FLAVOURS[TANH].constant("tanh_scale")  # tanh flavour: scale inside tanh, 0.7978845608
TANH_CUBIC_COEFF = FLAVOURS[TANH].constant("cubic")  # tanh flavour: coefficient of x**3
QUICK_ALPHA = FLAVOURS[QUICK].constant("quick_alpha")  # quick flavour: x * sigmoid(QUICK_ALPHA * x)
INV_SQRT_2 = 1.0 / FLAVOURS[EXACT].constant("sqrt2")  # exact flavour: erf argument is x / sqrt(2)


# ---- lookups ----------------------------------------------------------------------------------


def flavour(name: str) -> Flavour:
    """The record of a flavour by name."""
    try:
        return FLAVOURS[name]
    except KeyError:
        raise KeyError(f"no flavour {name!r}; catalogued: {', '.join(FLAVOURS)}") from None


def claimed_by(framework: str, op: str, attrs: Mapping[str, Any] | None = None) -> tuple[Flavour, Claim] | None:
    """The flavour an op of a framework claims with these attributes, and the claim; None when it claims none."""
    for f in FLAVOURS.values():
        for claim in f.claims:
            if claim.matches(framework, op, attrs or {}):
                return f, claim
    return None


def claim_for(name: str, framework: str, op: str) -> Claim | None:
    """How an op of a framework claims flavour `name` (e.g. the TFLite GELU flag for tanh), or None."""
    return next((c for c in flavour(name).claims if (c.framework, c.op) == (framework, op)), None)


def gelu20_flavour(approximate: str) -> str | None:
    """The flavour a Gelu-20 node with this approximate attribute computes (None for other values)."""
    return next((f.name for f in FLAVOURS.values() if f.gelu20_approximate == approximate), None)


# ---- sites --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    """One activation site found in a model, shared by all matchers.

    site_id is stable across runs ("{index}:{first node}", graph order); op describes what
    stands there ("Gelu", "com.microsoft.FastGelu", "erf-chain", "elementwise" for a region
    found by its numbers, ...); claimed is the flavour the structure (or, for a region, the
    numbers) says, times `scale`; nodes are the covered nodes (Constant nodes left out, as
    they may be shared); input/output are the tensors around the site, so it can be measured;
    note explains the claim (attributes, constants). used is False when no graph output depends
    on the site (dead code an exporter may drop); absorbed_by names the linear op(s) that take
    the site's whole output, which can absorb a constant scale of the site.
    """

    site_id: str
    op: str
    claimed: str
    nodes: tuple[str, ...]
    input: str
    output: str
    note: str = ""
    scale: float = 1.0
    used: bool = True
    absorbed_by: str = ""
