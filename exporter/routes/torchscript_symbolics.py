"""ONNX conversions the TorchScript exporter lacks at low opsets, registered per opset.

A handler is (aten op, opsets, symbolic function), the way the exporter's own symbolic_opsetN
modules are versioned:
- aten::scaled_dot_product_attention at opset 13: torch ships it from opset 14 only, but without a
  causal mask its conversion uses nothing newer than opset 13 (Transpose, Mul, Sqrt, MatMul,
  Softmax, Where, Add); a causal one needs Trilu (opset 14) and fails with one line.
- aten::diff from opset 13 to 17 (torch has none): transformers' masking utilities call
  torch.diff(position_ids, prepend=...). diff(x) = x[1:] - x[:-1] along dim, after prepending and
  appending; n = 1 only.
- aten::cumsum of a bool tensor, opsets 13 to 20: torch sums bools as int64, the exporter writes
  CumSum on the bool itself, which onnx.checker rejects; the bool is cast to int64 first.
torch is imported only when handlers are registered.
"""

from __future__ import annotations

import sys

INT64_MAX = 2**63 - 1
_registered: set[tuple[str, int]] = set()


def _sdpa_without_causal_mask(g, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                              enable_gqa=False):
    from torch.onnx._internal.torchscript_exporter import symbolic_helper, symbolic_opset14

    causal = symbolic_helper._maybe_get_const(is_causal, "b")
    if not isinstance(causal, bool) or causal:
        raise RuntimeError("scaled_dot_product_attention with is_causal=True needs Trilu (opset 14)")
    return symbolic_opset14.scaled_dot_product_attention(g, query, key, value, attn_mask, dropout_p, is_causal,
                                                         scale, enable_gqa)


def _diff(g, self, n, dim, prepend=None, append=None):
    from torch.onnx._internal.torchscript_exporter import symbolic_helper

    n, dim = symbolic_helper._get_const(n, "i", "n"), symbolic_helper._get_const(dim, "i", "dim")
    if n != 1:
        raise RuntimeError(f"aten::diff with n={n}: only n=1 converts")
    parts = [p for p in (prepend, self, append) if p is not None and not symbolic_helper._is_none(p)]
    x = g.op("Concat", *parts, axis_i=dim) if len(parts) > 1 else self
    later = symbolic_helper._slice_helper(g, x, axes=[dim], starts=[1], ends=[INT64_MAX])
    earlier = symbolic_helper._slice_helper(g, x, axes=[dim], starts=[0], ends=[-1])
    return g.op("Sub", later, earlier)


def _cumsum_counting_bools(g, self, dim, dtype=None):
    from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper, symbolic_opset11

    scalar = _type_utils.JitScalarType.from_value(self, _type_utils.JitScalarType.UNDEFINED)
    if scalar == _type_utils.JitScalarType.BOOL and (dtype is None or symbolic_helper._is_none(dtype)):
        self = g.op("Cast", self, to_i=_type_utils.JitScalarType.INT64.onnx_type())
    return symbolic_opset11.cumsum(g, self, symbolic_helper._get_const(dim, "i", "dim"), dtype)


# (aten op, opsets it is registered for, symbolic function)
HANDLERS = (
    ("aten::scaled_dot_product_attention", range(13, 14), _sdpa_without_causal_mask),
    ("aten::diff", range(13, 18), _diff),
    ("aten::cumsum", range(13, 21), _cumsum_counting_bools),
)


def register_for(opset: int | None) -> None:
    """Register every handler that covers `opset` with the TorchScript exporter (once per process)."""
    if opset is None:
        return
    torch = sys.modules["torch"]
    for op, opsets, function in HANDLERS:
        if opset in opsets and (op, opset) not in _registered:
            torch.onnx.register_custom_op_symbolic(op, function, opset)
            _registered.add((op, opset))
