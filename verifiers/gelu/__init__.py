"""GELU flavours: the shared catalogue, the ONNX site finder and the ONNX site fingerprint."""

from .catalogue import (
    EXACT,
    FLAVOURS,
    IDENTITY,
    INV_SQRT_2,
    PROBES,
    QUICK,
    QUICK_ALPHA,
    RELU,
    SQRT_2_OVER_PI,
    TANH,
    TANH_CUBIC_COEFF,
    UNKNOWN,
    Classification,
    Flavour,
    Site,
    classify,
)
from .fingerprint import Fingerprint, fingerprint_site, fingerprint_sites
from .onnx_sites import find_gelu_sites, find_relu_sites

__all__ = [
    "EXACT",
    "FLAVOURS",
    "IDENTITY",
    "INV_SQRT_2",
    "PROBES",
    "QUICK",
    "QUICK_ALPHA",
    "RELU",
    "SQRT_2_OVER_PI",
    "TANH",
    "TANH_CUBIC_COEFF",
    "UNKNOWN",
    "Classification",
    "Fingerprint",
    "Flavour",
    "Site",
    "classify",
    "find_gelu_sites",
    "find_relu_sites",
    "fingerprint_site",
    "fingerprint_sites",
]
