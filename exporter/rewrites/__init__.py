"""Graph rewrites on exported artifacts (ONNX ModelProto in, ModelProto out; .tflite bytes in, bytes out)."""

from .onnx_gelu import (
    CONSTANTS,
    ERF_FREE,
    FORMS,
    GELU_OP,
    PRIMITIVES,
    Form,
    decompose_gelu_ops,
    fuse_gelu_chains,
    gelu_op_sites,
    replace_site,
)
from .tflite_gelu import lower_gelu_ops, set_gelu_approximate

__all__ = [
    "CONSTANTS",
    "ERF_FREE",
    "FORMS",
    "GELU_OP",
    "PRIMITIVES",
    "Form",
    "decompose_gelu_ops",
    "fuse_gelu_chains",
    "gelu_op_sites",
    "lower_gelu_ops",
    "replace_site",
    "set_gelu_approximate",
]
