"""GELU flavours, whatever the format: the shared catalogue, the classification of measured
outputs, the neutral-graph chain matching, the verdict, and the source's site finders (PyTorch,
Keras). An artifact's sites are found, measured and rewritten by its format's package
(verifiers.formats.onnx, verifiers.formats.tflite: gelu_sites, gelu_fingerprint, gelu_inventory).

Names load on first use (the catalogue needs only the standard library). The PyTorch and Keras
finders import torch / tensorflow only when called.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "catalogue": ("EXACT", "FLAVOURS", "IDENTITY", "INV_SQRT_2", "QUICK", "QUICK_ALPHA", "RELU", "SQRT_2_OVER_PI",
                  "TANH", "TANH_CUBIC_COEFF", "UNKNOWN", "Flavour", "Site"),
    "classification": ("PROBES", "Classification", "classify"),
    "keras_sites": ("find_keras_relu_sites", "find_keras_sites"),
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
