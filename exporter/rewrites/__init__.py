"""Graph rewrites on exported artifacts (ONNX ModelProto in, ModelProto out)."""

from .onnx_gelu import (
    CONSTANTS,
    FORMS,
    GELU_OP,
    PRIMITIVES,
    Form,
    decompose_gelu_ops,
    gelu_op_sites,
    replace_site,
)

__all__ = ["CONSTANTS", "FORMS", "GELU_OP", "PRIMITIVES", "Form", "decompose_gelu_ops", "gelu_op_sites", "replace_site"]
