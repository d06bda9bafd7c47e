"""GELU flavours: the shared catalogue, site finders (ONNX, PyTorch, Keras) and the ONNX site fingerprint.

Names load on first use (the catalogue needs only the standard library; the finders and the
fingerprint bring numpy, onnx and onnxruntime). The PyTorch and Keras finders import torch /
tensorflow only when called.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "catalogue": ("EXACT", "FLAVOURS", "IDENTITY", "INV_SQRT_2", "QUICK", "QUICK_ALPHA", "RELU", "SQRT_2_OVER_PI",
                  "TANH", "TANH_CUBIC_COEFF", "UNKNOWN", "Flavour", "Site"),
    "classification": ("PROBES", "Classification", "classify"),
    "fingerprint": ("Fingerprint", "fingerprint_site", "fingerprint_sites"),
    "keras_sites": ("find_keras_relu_sites", "find_keras_sites"),
    "onnx_sites": ("find_gelu_sites", "find_relu_sites"),
    "torch_sites": ("find_torch_relu_sites", "find_torch_sites"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
