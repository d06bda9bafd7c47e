"""PyTorch -> TFLite with litert-torch (no TensorFlow needed).

litert-torch 0.10 traces with torch.export and names the SignatureDef "serving_default" after the
traced call: positional inputs become args_0, args_1 ... and outputs output_0 ... . The model is
wrapped so it is called by keyword and returns a dict, which gives the signature the source's input
and output names instead.

- Layout: the artifact keeps PyTorch's layout (NCHW stays NCHW); nothing is transposed to NHWC.
- 64-bit inputs: litert-torch downcasts int64/float64 I/O to 32 bits unless enable_x64; a source
  with 64-bit inputs is converted with enable_x64 so the artifact takes the source's dtypes.
- --quantize goes through litert-torch's ai-edge-quantizer recipes (full_fp16_recipe,
  full_dynamic_recipe: int8 channelwise weights, dynamic-range compute).
- --dynamic is refused: litert-torch 0.10 passes dynamic_shapes to torch.export, but then lowers
  most aten ops (mul, add, reshape: a Linear's bias already) through JAX at fixed sizes, which
  fails on a symbolic dimension even for a Linear-GELU-Linear MLP.
- litert-torch 0.10 miscompiles a broadcasting expand that a reshape and then a transpose read
  (transformers' repeat_kv for grouped-query attention, then q @ k^T: the transpose is lost and
  the artifact is wrong). Before conversion the model is captured with torch.export, and every
  expand a reshape reads is written as a concatenation of copies, which converts correctly
  (see concat_broadcasts); the note says how many.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from verifiers.errors import Incompatible, MissingFramework, one_line
from exporter.frameworks import FRAMEWORKS
from exporter.routes import ExportRequest, ExportResult, Route
from exporter.routes.keras_tflite import (
    QUANTIZE_MODES,
    check_converted,
    check_tflite_request,
    quantize_notes,
)
from verifiers.gelu.torch_sites import is_exported_program
from verifiers.quiet import quiet_exporter
from exporter.sources import Source, make_batches
from verifiers.tflite_model import WRAPPER_SCOPE

LAYOUT_NOTE = "litert-torch keeps PyTorch's layout: NCHW inputs and outputs stay NCHW (not converted to NHWC)"
WIDE_DTYPES = ("int64", "float64")


def _require_litert_torch():
    try:
        import litert_torch
    except ImportError as exc:
        raise MissingFramework("litert_torch", "tflite") from exc
    return litert_torch


@contextlib.contextmanager
def _litert_torch_quiet(litert_torch):
    """No rich progress console; its root-logger warnings ("converted in training mode", x64) are
    the quiet exporter's to hide."""
    key = "LITERT_TORCH_SHOW_PROGRESS"
    saved = os.environ.get(key)
    litert_torch.config.show_progress = False
    try:
        with quiet_exporter() as printed:
            yield printed
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def _by_name(torch, module, input_names: list[str], output_names: list[str], by_keyword: bool):
    """`module` called by keyword, returning {output name: tensor} in Source.run's flattening order."""
    from torch.utils import _pytree as pytree

    class ByName(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module  # WRAPPED_ATTRIBUTE

        def forward(self, **inputs):
            if by_keyword:
                result = self.inner(**inputs)
            else:
                result = self.inner(*[inputs[name] for name in input_names])
            leaves = [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
            if len(leaves) != len(output_names):
                return tuple(leaves)
            return dict(zip(output_names, leaves))

    # Tensor names carry module paths: the wrapper's is short, and readers drop it (user_scope).
    ByName.__module__, _, ByName.__qualname__ = WRAPPER_SCOPE.rpartition(".")
    wrapper = ByName()
    wrapper.training = False  # the wrapper only: an ExportedProgram's module() refuses train()/eval()
    return wrapper


def concat_broadcasts(torch, module) -> int:
    """In a torch.export graph module, replace every aten.expand that a reshape or view reads by
    concatenations of copies along the broadcast dimensions (size 1 to n): the same values,
    which the reshape copies out anyway. Returns how many expands were replaced."""
    aten = torch.ops.aten
    reshapes = {aten.reshape.default, aten.view.default, aten._unsafe_view.default}
    graph = module.graph
    replaced = 0
    for node in list(graph.nodes):
        if node.target is not aten.expand.default or not any(user.target in reshapes for user in node.users):
            continue
        source, sizes = node.args[0], list(node.args[1])
        value = source.meta.get("val")
        if value is None or value.dim() != len(sizes):
            continue
        repeats = [(dim, size) for dim, (old, size) in enumerate(zip(value.shape, sizes))
                   if isinstance(size, int) and old == 1 and size > 1]
        if not repeats:
            continue
        with graph.inserting_before(node):
            copies = source
            for dim, size in repeats:
                copies = graph.call_function(aten.cat.default, ([copies] * size, dim))
        node.replace_all_uses_with(copies)
        graph.erase_node(node)
        replaced += 1
    if replaced:
        graph.lint()
        module.recompile()
    return replaced


def _without_broadcast_reshapes(torch, wrapper, sample) -> tuple[object, int]:
    """The module to convert: `wrapper` captured and rewritten by concat_broadcasts when it has
    such expands, else `wrapper` itself (also when torch.export cannot capture it: litert-torch
    then reports its own failure)."""
    try:
        module = torch.export.export(wrapper, (), dict(sample)).module()
    except Exception:
        return wrapper, 0
    replaced = concat_broadcasts(torch, module)
    return (module, replaced) if replaced else (wrapper, 0)


def _quant_config(quantize: str | None):
    if quantize is None:
        return None
    try:
        from litert_torch.generative.quantize import quant_recipes
    except ImportError as exc:
        raise Incompatible(
            f"--quantize {quantize} for PyTorch -> TFLite needs ai-edge-quantizer: {one_line(exc)}") from exc
    if quantize == "fp16":
        return quant_recipes.full_fp16_recipe()
    return quant_recipes.full_dynamic_recipe()


class TorchToTflite(Route):
    framework = "torch"
    format = "tflite"
    exporters = ("litert-torch",)
    quantize_modes = QUANTIZE_MODES

    def export(self, source: Source, request: ExportRequest, dest: Path, progress) -> ExportResult:
        check_tflite_request(request)
        torch = FRAMEWORKS["torch"].require("torch")
        litert_torch = _require_litert_torch()
        if request.dynamic:
            axes = ", ".join(f"{a.input} axis {a.axis}" for a in request.dynamic)
            raise Incompatible(f"--dynamic {axes}: litert-torch {litert_torch.__version__} cannot keep it dynamic "
                               "(it lowers ops at fixed sizes); PyTorch -> TFLite exports static shapes only")
        feed = request.sample_inputs or source.example or make_batches(source, 0, 1)[-1]
        output_names = list(request.output_names) or source.run(feed)[0]
        args, kwargs = FRAMEWORKS["torch"].example_tensors(source, feed)
        sample = dict(kwargs) if kwargs else dict(zip(source.input_names, args))
        module = source.model.module() if is_exported_program(source.model) else source.model
        wrapper = _by_name(torch, module, source.input_names, output_names, source.by_keyword)
        wide = [spec.name for spec in source.inputs if spec.dtype in WIDE_DTYPES]
        quant_config = _quant_config(request.quantize)

        label = f"litert-torch {litert_torch.__version__}"
        progress(f"converting with {label}" + (f", --quantize {request.quantize}" if request.quantize else ""))
        try:
            with _litert_torch_quiet(litert_torch):
                module, concatenated = _without_broadcast_reshapes(torch, wrapper, sample)
                edge_model = litert_torch.convert(
                    module, sample_kwargs=sample, quant_config=quant_config, enable_x64=bool(wide))
                content = edge_model.model_content()
        except Exception as exc:
            raise Incompatible(f"{label} failed: {one_line(exc)}") from exc
        check_converted(content, label, allow_custom=True)
        Path(dest).write_bytes(content)
        notes = [LAYOUT_NOTE]
        if concatenated:
            notes.append(f"{concatenated} broadcasting expand(s) read by a reshape written as concatenations before "
                         f"{label} (it miscompiles expand -> reshape -> transpose)")
        if wide:
            notes.append(f"64-bit inputs {', '.join(wide)} kept 64-bit (litert-torch enable_x64)")
        notes.extend(quantize_notes(request.quantize, content, label))
        return ExportResult(exporter=label, notes=notes)
