"""GELU flavours: the shared catalogue, site finders (ONNX, PyTorch, Keras) and the ONNX site fingerprint.

The PyTorch and Keras finders import torch / tensorflow only when called.
"""

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
from .keras_sites import find_keras_relu_sites, find_keras_sites
from .onnx_sites import find_gelu_sites, find_relu_sites
from .torch_sites import find_torch_relu_sites, find_torch_sites

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
    "find_keras_relu_sites",
    "find_keras_sites",
    "find_relu_sites",
    "find_torch_relu_sites",
    "find_torch_sites",
    "fingerprint_site",
    "fingerprint_sites",
]
