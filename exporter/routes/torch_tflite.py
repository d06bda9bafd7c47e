"""PyTorch -> TFLite with litert-torch (no TensorFlow needed).

litert-torch 0.10 traces with torch.export and names the SignatureDef "serving_default" after the
traced call: positional inputs become args_0, args_1 ... and outputs output_0 ... . The model is
wrapped so it is called by keyword and returns a dict, which gives the signature the source's input
and output names instead.

- Layout: the artifact keeps PyTorch's layout (NCHW stays NCHW); nothing is transposed to NHWC.
- 64-bit inputs: litert-torch downcasts int64/float64 I/O to 32 bits unless enable_x64; a source
  with 64-bit inputs is converted with enable_x64 so the artifact takes the source's dtypes.
- --quantize fp16 and dynamic-int8 go through litert-torch's ai-edge-quantizer recipes
  (full_fp16_recipe, full_dynamic_recipe: int8 channelwise weights, dynamic-range compute).
- --quantize int8 goes through litert-torch's PT2E path first: PT2EQuantizer (per-channel symmetric
  int8 weights, histogram-calibrated int8 activations) annotates the torch.export graph, torchao's
  prepare_pt2e observes it on the calibration feeds, convert_pt2e writes the Q/DQ pairs and
  litert-torch lowers them to int8 kernels. Ops PT2EQuantizer does not annotate (LayerNorm,
  softmax, embeddings, bmm: a transformers BERT keeps 123 float ops) stay float; when the written
  flatbuffer has any float op, the float TFLite litert-torch writes for the same program is
  quantized instead by ai-edge-quantizer (static_wi8_ai8, plus an int8 EMBEDDING_LOOKUP), which
  quantizes most builtins; the note names what PT2E left and quantization["method"] which path
  ran. Its calibration takes each tensor's plain min/max over the feeds, not its default moving
  average, which narrows the ranges so held-out inputs clip (8 seeded calibration batches, 4
  held-out, output SQNR: examples/mlp.py PT2E 26.7 dB, ai-edge-quantizer min/max 26.6 vs moving
  average 10.6; the int8 fixtures' CNN 37.3, 38.2 vs 21.2; their tiny BERT, which PT2E leaves
  partly float: 32.6 vs 27.1). A float op the fallback leaves fails the export (int8_result).
- Both write int8 inputs and outputs (the calibrated quantization of each float input and output;
  token ids stay integer); --io float and uint8 put a QUANTIZE (DEQUANTIZE, QUANTIZE) between each
  and a new float32 or uint8 tensor, same scale (zero point + 128 for uint8) (see retype_io).
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

from verifiers.errors import BadInput, Incompatible, MissingFramework, one_line
from exporter.frameworks import FRAMEWORKS
from exporter.routes import ExportRequest, ExportResult, Route, float_compute_ops, int8_result
from exporter.routes.keras_tflite import (
    QUANTIZE_MODES,
    check_converted,
    calibrating,
    check_tflite_request,
    quantize_notes,
)
from verifiers.gelu.torch_sites import is_exported_program
from verifiers.quiet import quiet_exporter
from exporter.sources import Source, make_batches
from verifiers.tflite_model import WRAPPER_SCOPE

LAYOUT_NOTE = "litert-torch keeps PyTorch's layout: NCHW inputs and outputs stay NCHW (not converted to NHWC)"
WIDE_DTYPES = ("int64", "float64")


def require_litert_torch():
    try:
        import litert_torch
    except ImportError as exc:
        raise MissingFramework("litert_torch", "tflite") from exc
    return litert_torch


@contextlib.contextmanager
def litert_torch_quiet(litert_torch):
    """No rich progress console; its root-logger warnings ("converted in training mode", x64), and
    what it prints to stderr (ai-edge-quantizer's tqdm bars of an fp16 or dynamic-int8 recipe),
    are the quiet exporter's to hide."""
    key = "LITERT_TORCH_SHOW_PROGRESS"
    saved = os.environ.get(key)
    litert_torch.config.show_progress = False
    try:
        with quiet_exporter() as printed, contextlib.redirect_stderr(printed):
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
    if quantize in (None, "int8"):
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
    static_shapes = True

    def export(self, source: Source, request: ExportRequest, dest: Path, progress) -> ExportResult:
        check_tflite_request(request)
        torch = FRAMEWORKS["torch"].require("torch")
        litert_torch = require_litert_torch()
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
        progress(f"converting with {label}" + (f", --quantize {request.quantize}" if request.quantize else "")
                 + (" through PT2E" if request.quantize == "int8" else "") + calibrating(request))
        try:
            with litert_torch_quiet(litert_torch):
                if request.quantize == "int8":
                    module, concatenated, quant_config = _pt2e_quantized(torch, source, wrapper, sample, request)
                else:
                    module, concatenated = _without_broadcast_reshapes(torch, wrapper, sample)
                edge_model = litert_torch.convert(
                    module, sample_kwargs=sample, quant_config=quant_config, enable_x64=bool(wide))
                content = edge_model.model_content()
        except Exception as exc:
            raise Incompatible(f"{label} failed: {one_line(exc)}") from exc
        check_converted(content, label, allow_custom=True)
        Path(dest).write_bytes(content)
        fallback_note = None
        if request.quantize == "int8":
            method = (f"{label} PT2E (PT2EQuantizer per-channel symmetric, torchao {_version('torchao')} "
                      f"prepare_pt2e/convert_pt2e, torch {torch.__version__})")
            left = sorted({op.op_type for op in float_compute_ops(Path(dest), "tflite")})
            if left:
                progress(f"PT2E left {', '.join(left)} float: quantizing the float TFLite with ai-edge-quantizer")
                content, method = _aeq_quantized(torch, litert_torch, wrapper, sample, wide, request, label)
                fallback_note = f"--quantize int8: PT2E left {', '.join(left)} float, so {method} quantized instead"
            Path(dest).write_bytes(retype_io(content, request.io))
        notes = [LAYOUT_NOTE]
        if concatenated:
            notes.append(f"{concatenated} broadcasting expand(s) read by a reshape written as concatenations before "
                         f"{label} (it miscompiles expand -> reshape -> transpose)")
        if wide:
            notes.append(f"64-bit inputs {', '.join(wide)} kept 64-bit (litert-torch enable_x64)")
        notes.extend(quantize_notes(request.quantize, content, label))
        if fallback_note:
            notes.append(fallback_note)
        result = ExportResult(exporter=label, notes=notes)
        if request.quantize == "int8":
            result.quantization = int8_result(request, method, dest, "tflite")
        return result


def _version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


def _aeq_quantized(torch, litert_torch, wrapper, sample: dict, wide: list[str], request: ExportRequest,
                   label: str) -> tuple[bytes, str]:
    """The float TFLite litert-torch writes for `wrapper`, fully quantized by ai-edge-quantizer
    (int8 weights and activations; token ids stay integer), each tensor's range the plain min/max
    over the calibration feeds; with the method that says so."""
    try:
        with litert_torch_quiet(litert_torch):
            module, _ = _without_broadcast_reshapes(torch, wrapper, sample)
            float_model = litert_torch.convert(module, sample_kwargs=sample, enable_x64=bool(wide)).model_content()
    except Exception as exc:
        raise Incompatible(f"{label} failed on the float program: {one_line(exc)}") from exc
    check_converted(float_model, label, allow_custom=True)
    try:
        from ai_edge_quantizer import calibrator, qtyping, quantizer, recipe_manager
        from ai_edge_quantizer.utils import qsv_utils
    except ImportError as exc:
        raise Incompatible(f"--quantize int8: PT2E left ops float, and the fallback needs ai-edge-quantizer: "
                           f"{one_line(exc)}") from exc

    aeq = f"ai-edge-quantizer {_version('ai-edge-quantizer')}"
    manager = recipe_manager.RecipeManager()
    # static_wi8_ai8: per-channel symmetric int8 weights, per-tensor asymmetric int8 activations ...
    manager.add_static_config(".*", qtyping.TFLOperationName.ALL_SUPPORTED, 8, 8)
    # ... and an int8 EMBEDDING_LOOKUP, which the recipe leaves float (its policy lists none): a
    # per-tensor table, as TFLite's int8 -> int8 kernel copies rows (see _requantize_lookups).
    manager.add_quantization_config(".*", qtyping.TFLOperationName.EMBEDDING_LOOKUP, qtyping.OpQuantizationConfig(
        qtyping.TensorQuantizationConfig(8, symmetric=False), qtyping.TensorQuantizationConfig(8),
        compute_precision=qtyping.ComputePrecision.INTEGER, skip_checks=True))
    try:
        with quiet_exporter() as printed, contextlib.redirect_stderr(printed):  # its tqdm progress bars
            # Quantizer.calibrate keeps a moving average of each range, narrower than what the
            # feeds reached (held-out inputs clip); its Calibrator takes the min/max update instead.
            calibration = calibrator.Calibrator(float_model, num_threads=os.cpu_count() or 1,
                                                qsv_update_func=qsv_utils.min_max_update)
            signature = next(iter(calibration.get_signature_list()))
            calibration.calibrate({signature: list(request.calibration)}, manager)
            quantized = quantizer.Quantizer(float_model, manager.get_quantization_recipe()).quantize(
                calibration.get_model_qsvs(), enable_progress_bar=False, enable_progress_report=False).quantized_model
    except Exception as exc:
        raise Incompatible(f"{aeq} failed: {one_line(exc)}") from exc
    return _requantize_lookups(bytes(quantized)), (
        f"{aeq} static_wi8_ai8 with int8 EMBEDDING_LOOKUP (min/max over {len(request.calibration)} calibration "
        f"feeds) on the {label} float TFLite")


def _requantize_lookups(content: bytes) -> bytes:
    """A TFLite model whose int8 EMBEDDING_LOOKUPs write the table's scale and zero point (the
    kernel copies int8 rows as they are), then a QUANTIZE requantizes to the calibrated output."""
    from ai_edge_litert import schema_py_generated as fb
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    changed = False
    for graph in model.subgraphs:
        operators = []
        for op in graph.operators:
            operators.append(op)
            code = model.operatorCodes[op.opcodeIndex]
            if max(code.builtinCode, code.deprecatedBuiltinCode) != fb.BuiltinOperator.EMBEDDING_LOOKUP:
                continue
            table, output = graph.tensors[op.inputs[1]], graph.tensors[op.outputs[0]]
            if table.type != fb.TensorType.INT8 or output.type != fb.TensorType.INT8:
                continue
            rows = fb.TensorT()
            rows.name, rows.type, rows.shape = output.name + b"/table_scale", output.type, list(output.shape)
            rows.quantization = fb.QuantizationParametersT()
            rows.quantization.scale = list(table.quantization.scale)
            rows.quantization.zeroPoint = list(table.quantization.zeroPoint)
            model.buffers.append(fb.BufferT())
            rows.buffer = len(model.buffers) - 1
            graph.tensors.append(rows)
            requantize = fb.OperatorT()
            requantize.opcodeIndex = _opcode(model, fb.BuiltinOperator.QUANTIZE)
            requantize.inputs, requantize.outputs = [len(graph.tensors) - 1], [op.outputs[0]]
            op.outputs = [len(graph.tensors) - 1]
            operators.append(requantize)
            changed = True
        graph.operators = operators
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model)) if changed else content


def _opcode(model, builtin: int) -> int:
    """The index of `builtin`'s operator code in `model` (added if missing), at version 2 or more (int8)."""
    from ai_edge_litert import schema_py_generated as fb

    for index, code in enumerate(model.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
            code.version = max(code.version, 2)
            return index
    code = fb.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = builtin
    code.version = 2
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _pt2e_quantized(torch, source: Source, wrapper, sample: dict, request: ExportRequest):
    """`wrapper` captured with torch.export (expands a reshape reads concatenated), annotated by
    PT2EQuantizer, observed on the calibration feeds and converted to Q/DQ pairs; with how many
    expands were concatenated and the QuantConfig litert-torch lowers the pairs with."""
    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
    from litert_torch.quantize.quant_config import QuantConfig
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False))
    module = torch.export.export(wrapper, (), dict(sample)).module()
    concatenated = concat_broadcasts(torch, module)
    prepared = prepare_pt2e(module, quantizer)
    with torch.no_grad():
        for feed in request.calibration:
            args, kwargs = FRAMEWORKS["torch"].example_tensors(source, feed)
            prepared(**(dict(kwargs) if kwargs else dict(zip(source.input_names, args))))
    return convert_pt2e(prepared, fold_quantize=False), concatenated, QuantConfig(pt2e_quantizer=quantizer)


def retype_io(content: bytes, io: str) -> bytes:
    """A TFLite model whose int8 inputs and outputs (what PT2E writes) take and give `io` instead:
    float32 through QUANTIZE / DEQUANTIZE ops, uint8 through requantizing QUANTIZE ops (same scale,
    zero point + 128). Inputs and outputs of other types (token ids) stay; a float one the quantizer
    left float (its first or last op has no int8 form there) refuses --io int8/uint8."""
    from ai_edge_litert import schema_py_generated as fb
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    graph = model.subgraphs[0]
    outer_type = fb.TensorType.FLOAT32 if io == "float" else fb.TensorType.UINT8
    moved: dict[int, int] = {}  # int8 I/O tensor -> the tensor that replaces it as the model's I/O
    first, last = [], []
    for side in ("inputs", "outputs"):
        indices = getattr(graph, side)
        for k, index in enumerate(indices):
            inner = graph.tensors[index]
            quantization = inner.quantization
            if inner.type == fb.TensorType.FLOAT32 and io != "float":
                raise BadInput(f"--io {io}: {side[:-1]} {inner.name.decode()} stayed float32 (the op "
                               f"{'reading' if side == 'inputs' else 'writing'} it was left float); use --io float")
            if io == "int8" or inner.type != fb.TensorType.INT8 or quantization is None or len(quantization.scale or ()) != 1:
                continue
            outer = fb.TensorT()
            outer.name, outer.type = inner.name, outer_type
            outer.shape, outer.shapeSignature = list(inner.shape), inner.shapeSignature and list(inner.shapeSignature)
            model.buffers.append(fb.BufferT())
            outer.buffer = len(model.buffers) - 1
            if io == "uint8":
                outer.quantization = fb.QuantizationParametersT()
                outer.quantization.scale = list(quantization.scale)
                outer.quantization.zeroPoint = [int(quantization.zeroPoint[0]) + 128]
            inner.name = inner.name + b"/int8"
            graph.tensors.append(outer)
            moved[index] = indices[k] = len(graph.tensors) - 1
            op = fb.OperatorT()
            if side == "inputs":
                op.opcodeIndex, op.inputs, op.outputs = _opcode(model, fb.BuiltinOperator.QUANTIZE), [moved[index]], [index]
                first.append(op)
            else:
                builtin = fb.BuiltinOperator.DEQUANTIZE if io == "float" else fb.BuiltinOperator.QUANTIZE
                op.opcodeIndex, op.inputs, op.outputs = _opcode(model, builtin), [index], [moved[index]]
                last.append(op)
    if not moved:
        return content
    graph.operators = first + graph.operators + last
    for signature in model.signatureDefs or []:
        for entry in (*signature.inputs, *signature.outputs):
            entry.tensorIndex = moved.get(entry.tensorIndex, entry.tensorIndex)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))
