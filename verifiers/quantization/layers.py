"""Where an integer (int8) artifact loses its accuracy: SQNR of every quantized tensor against the
float model's tensor of the same name, and the first layer in graph order that collapses.

The errors accumulate along the graph, so the tensors after a ruined layer inherit its error;
`first_collapse` names the earliest tensor below the threshold (graph order), which is where the
loss starts. Each format runs the layers its own way (ArtifactFormat.layer_errors: verifiers.formats.onnx.layers,
verifiers.formats.tflite.layers). Both models run through the
artifact's runtime (`Runner.run_inspection`: as written, no graph rewrite, no delegate), and
the whole diagnosis runs in that runtime's worker (exporter.checks.quantization), like every other run:

- ONNX (as onnxruntime.quantization.qdq_loss_debug does): every
  DequantizeLinear output of the QDQ model, activations and weights, becomes an extra graph
  output, and so does the float model's tensor it stands for; both run without graph rewrites,
  so the QDQ model computes what its Q/DQ nodes say. A DequantizeLinear output stands for the
  first of these names the float model has: its own output, the input of the QuantizeLinear
  feeding it, its own input, then each of those with onnxruntime's suffixes taken off
  (`_QuantizeLinear_Input`, `_DequantizeLinear_Output`, `_quantized`). Without a float model,
  `float_from_qdq` rebuilds one from the QDQ model (Q/DQ pairs on activations removed, weights
  dequantized): weight rounding is then not seen, only activation rounding.
- TFLite: both models keep every tensor; every int8/uint8/int16 tensor, and every int32 tensor with
  quantization parameters (biases), is dequantized with its scale(s) and zero point(s) and
  matched by name with the float model's tensor. The converter mostly keeps names; a quantized
  tensor whose name the float model does not have, or has with another shape (a deduplicated
  constant, the QUANTIZE op's output of a float-input model), is not compared, and the summary
  counts it. Float inputs are quantized with the int8 model's input quantization when its inputs
  are integer.

Graph order (`LayerError.order`) is the position of a tensor in a walk of the quantized model's
operators in their stored (topological) order: each operator's inputs not yet seen, then its
outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verifiers.errors import BadInput
from verifiers.naming import shown


@dataclass(frozen=True)
class LayerError:
    tensor: str  # the float model's name of the tensor
    op_type: str  # the float model's op producing it ("input", "initializer"/"constant" for the rest)
    sqnr_db: float
    order: int  # graph order: smaller runs earlier


def first_collapse(layers: list[LayerError], min_sqnr_db: float) -> LayerError | None:
    """The earliest tensor in graph order whose SQNR is below min_sqnr_db (None: every one reaches it)."""
    below = [layer for layer in layers if not layer.sqnr_db >= min_sqnr_db]
    return min(below, key=lambda layer: layer.order) if below else None


@dataclass(frozen=True)
class LayerDiagnosis:
    layers: list[LayerError]  # worst first
    unmatched: int  # quantized tensors not compared (no float tensor of that name and shape)
    weights_seen: bool = True  # False: the float reference was rebuilt from the QDQ model

    def summary(self, min_sqnr_db: float) -> str:
        """One line: how many tensors were compared, the first collapse and the worst tensor."""
        if not self.layers:
            text = "no quantized tensor matched a float tensor by name"
        else:
            worst = self.layers[0]
            collapse = first_collapse(self.layers, min_sqnr_db)
            text = f"{len(self.layers)} quantized tensor(s) compared; "
            if collapse is None:
                text += f"all reach {min_sqnr_db:g} dB (lowest {_named(worst)})"
            else:
                text += f"first below {min_sqnr_db:g} dB: {_named(collapse)}; worst {_named(worst)}"
        if self.unmatched:
            text += f"; {self.unmatched} quantized tensor(s) have no float tensor of the same name and shape"
        if not self.weights_seen:
            text += "; float reference rebuilt from the QDQ model: weight rounding is not seen"
        return text


def _named(layer: LayerError) -> str:
    return f"{shown(layer.tensor)} ({layer.op_type}) {layer.sqnr_db:.1f} dB"


def ranked(layers: list[LayerError]) -> list[LayerError]:
    return sorted(layers, key=lambda layer: (layer.sqnr_db, layer.order))


def diagnose_layers(quantized_path: str | Path, float_path: str | Path | None,
                    feeds: list[dict[str, np.ndarray]], fmt, runner_class: type | None = None) -> LayerDiagnosis:
    """Per-tensor SQNR of a quantized model against its float model, the layers run the way `fmt`
    (a verifiers.formats ArtifactFormat) runs them, by `runner_class` (verifiers.runtimes; by
    default the format's runtime); float_path None is allowed for ONNX (float_from_qdq)."""
    if not feeds:
        raise BadInput(f"{quantized_path}: per-layer diagnosis needs at least one feed")
    if runner_class is None:
        from verifiers.runtimes import runtime_for

        runner_class = runtime_for(fmt.name)
    return fmt.layer_errors(Path(quantized_path), None if float_path is None else Path(float_path), feeds,
                            runner_class)


def layer_errors(quantized_path: str | Path, float_path: str | Path | None, feeds: list[dict[str, np.ndarray]],
                 fmt) -> list[LayerError]:
    """diagnose_layers' tensors, worst first."""
    return diagnose_layers(quantized_path, float_path, feeds, fmt).layers
