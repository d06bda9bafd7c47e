"""Check a TFLite model's int8 quantization parameters against the LiteRT 8-bit quantization spec.

https://ai.google.dev/edge/litert/models/quantization_spec (also
tensorflow/lite/g3doc/performance/quantization_spec.md) says:

    Per-axis (aka per-channel in Conv ops) or per-tensor weights are represented by int8 two's
    complement values in the range [-127, 127] with zero-point equal to 0. Per-tensor
    activations/inputs are represented by int8 two's complement values in the range [-128, 127],
    with a zero-point in range [-128, 127].

and, per operator:

    CONV_2D
      Input 1 (Weight): data_type int8, range [-127, 127], granularity per-axis (dim = 0),
                        restriction: zero_point = 0
      Input 2 (Bias):   data_type int32, granularity per-axis (dim = 0),
                        restriction: (scale, zero_point) = (input0_scale * input1_scale[...], 0)
    DEPTHWISE_CONV_2D   the same, per-axis (dim = 3)
    FULLY_CONNECTED     the same, weight granularity per-tensor
    LOGISTIC            Output 0 restriction: (scale, zero_point) = (1.0 / 256.0, -128)
    SOFTMAX             Output 0 restriction: (scale, zero_point) = (1.0 / 256.0, -128)
    TANH                Output 0 restriction: (scale, zero_point) = (1.0 / 128.0, 0)
    L2_NORMALIZATION    Output 0 restriction: (scale, zero_point) = (1.0 / 128.0, 0)
    LOG_SOFTMAX         Output 0 restriction: (scale, zero_point) = (16.0 / 256.0, 127)

Checked here, for int8 tensors only: weights symmetric (every zero point 0) and in [-127, 127];
CONV_2D / DEPTHWISE_CONV_2D weights per-axis along dimension 0 / 3 with one scale per slice (a
FULLY_CONNECTED weight may be either: the converter writes it per-axis along 0); int32 biases
with zero point 0 and scale input_scale × weight_scale per channel, within BIAS_SCALE_RTOL; the
fixed output parameters above. Nothing runs and nothing native loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verifiers.tflite_model import Operator, Tensor, TFLiteModel

# Operators with (input, weight, bias) -> the per-axis dimension their weight must use
# (None: per-tensor or per-axis along 0, both accepted).
WEIGHTED_OPS: dict[str, int | None] = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": None}
# Operators whose int8 output has fixed (scale, zero point).
FIXED_OUTPUTS: dict[str, tuple[float, int]] = {
    "LOGISTIC": (1.0 / 256.0, -128),
    "SOFTMAX": (1.0 / 256.0, -128),
    "TANH": (1.0 / 128.0, 0),
    "L2_NORMALIZATION": (1.0 / 128.0, 0),
    "LOG_SOFTMAX": (16.0 / 256.0, 127),
}
# The converter computes a bias scale as a float32 product: allow its rounding and a little more.
BIAS_SCALE_RTOL = 1e-4
FIXED_SCALE_RTOL = 1e-6


@dataclass(frozen=True)
class Violation:
    subgraph: int
    op_index: int
    op_name: str
    tensor: str
    rule: str  # weight-zero-point, weight-range, weight-per-axis, bias-zero-point, bias-scale, fixed-output
    found: float | int | str
    message: str


def int8_spec_violations(model: TFLiteModel) -> list[Violation]:
    """Every departure from the int8 quantization spec, in subgraph and operator order."""
    violations: list[Violation] = []
    for g, subgraph in enumerate(model.subgraphs):
        for op in subgraph.operators:
            name = model.opcode(op).name
            tensors = subgraph.tensors

            def violation(tensor: Tensor, rule: str, found, what: str, op=op, name=name, g=g) -> Violation:
                where = f"subgraph {g} " if g else ""
                return Violation(g, op.index, name, tensor.name, rule, found,
                                 f"{where}op {op.index} {name}: {what}")

            if name in WEIGHTED_OPS:
                violations += _weighted(model, op, tensors, WEIGHTED_OPS[name], violation)
            if name in FIXED_OUTPUTS and op.outputs and op.outputs[0] >= 0:
                output = tensors[op.outputs[0]]
                scale, zero_point = FIXED_OUTPUTS[name]
                if output.dtype == "int8" and output.scales and not (
                        np.isclose(output.scales[0], scale, rtol=FIXED_SCALE_RTOL, atol=0)
                        and output.zero_points[:1] == (zero_point,)):
                    found = f"({output.scales[0]:g}, {output.zero_points[0] if output.zero_points else '?'})"
                    violations.append(violation(output, "fixed-output", found,
                                                f"output {output.name} has (scale, zero point) {found}, the int8 spec "
                                                f"fixes ({scale:g}, {zero_point})"))
    return violations


def _weighted(model: TFLiteModel, op: Operator, tensors, axis: int | None, violation) -> list[Violation]:
    inputs = list(op.inputs) + [-1] * (3 - len(op.inputs))
    if inputs[1] < 0 or tensors[inputs[1]].dtype != "int8" or not tensors[inputs[1]].scales:
        return []
    weight = tensors[inputs[1]]
    found: list[Violation] = []
    nonzero = [zp for zp in weight.zero_points if zp != 0]
    if nonzero:
        found.append(violation(weight, "weight-zero-point", nonzero[0],
                               f"weight {weight.name} has zero point {nonzero[0]}, the int8 spec wants 0 (symmetric)"))
    if weight.buffer > 0 and -128 in np.frombuffer(model.buffer_bytes(weight.buffer), np.int8):
        found.append(violation(weight, "weight-range", -128,
                               f"weight {weight.name} holds -128, the int8 spec's weight range is [-127, 127]"))
    if axis is not None and weight.shape:
        channels = weight.shape[axis]
        if len(weight.scales) != channels or (channels > 1 and weight.quantized_dimension != axis):
            what = (f"{len(weight.scales)} scale(s) along dimension {weight.quantized_dimension}"
                    if len(weight.scales) > 1 else "one scale (per-tensor)")
            found.append(violation(weight, "weight-per-axis", what,
                                   f"weight {weight.name} has {what}, the int8 spec wants {channels} along dimension {axis}"))
    if inputs[2] >= 0 and inputs[0] >= 0:
        found += _bias(tensors[inputs[0]], weight, tensors[inputs[2]], violation)
    return found


def _bias(source: Tensor, weight: Tensor, bias: Tensor, violation) -> list[Violation]:
    if bias.dtype != "int32" or not bias.scales or source.scale is None:
        return []
    found: list[Violation] = []
    nonzero = [zp for zp in bias.zero_points if zp != 0]
    if nonzero:
        found.append(violation(bias, "bias-zero-point", nonzero[0],
                               f"bias {bias.name} has zero point {nonzero[0]}, the int8 spec wants 0"))
    expected = source.scale * np.asarray(weight.scales, np.float64)
    scales = np.asarray(bias.scales, np.float64)
    if scales.size not in (1, expected.size):
        return found + [violation(bias, "bias-scale", f"{scales.size} scales",
                                  f"bias {bias.name} has {scales.size} scale(s) for {expected.size} weight scale(s)")]
    off = ~np.isclose(scales, expected, rtol=BIAS_SCALE_RTOL, atol=0)
    if off.any():
        channel = int(np.argmax(off))
        got, want = scales[channel if scales.size > 1 else 0], expected[channel]
        found.append(violation(bias, "bias-scale", float(got),
                               f"bias {bias.name} has scale {got:.6g} in channel {channel}, the int8 spec wants input "
                               f"scale × weight scale = {want:.6g}"))
    return found
