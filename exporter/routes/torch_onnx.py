"""PyTorch -> ONNX with torch.onnx.

torch 2.13 has two exporters. The dynamo exporter (the default) builds at opset 18 and converts
down when asked for less, but keeps 18 and only logs a warning when a conversion step is missing.
The TorchScript exporter honours opsets 7 to 20 exactly but fails on some models. "auto" tries the
one likelier to honour the request first and falls back to the other; whichever produced it, the
artifact's opset is checked against the request.

Below 18, dynamo's conversion keeps Split-18's num_outputs attribute, which older Splits do not
have (onnx.checker rejects the model): it is replaced by what Split-13 reads, an even split or
explicit sizes (see split_sizes_for_opset).

Dynamic axes: the dynamo exporter gets one torch.export Dim per symbol (named after it, with the
axis's range), so axes that share a symbol are one dimension; it specialises a dimension the
model's code fixes (and one exported at size 1), which verification then finds static. The
TorchScript exporter gets the symbols as dynamic_axes names and no ranges; it bakes every size
model code reads with int(), and its tracer's warnings about it become hints with the model's
file:line.

--quantize int8 exports float as above, then quantizes with onnxruntime (exporter.routes.onnx_quantize).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from pathlib import Path

from verifiers.errors import ExportgateError, Incompatible, one_line
from exporter.frameworks import FRAMEWORKS
from exporter.routes import ExportRequest, ExportResult, Route, check_int8_request
from exporter.routes.onnx_float16 import export_fp16
from exporter.routes.onnx_quantize import export_int8
from exporter.routes import torchscript_symbolics
from verifiers.quiet import quiet_exporter
from exporter.sources import Source
from exporter.staging import remove_artifact
from verifiers.gelu.torch_sites import is_exported_program
from verifiers.onnx_model import default_opset, iter_graphs, load_structure
from verifiers.sizes import parts_of

# The highest opset the dynamo exporter converts to: onnxscript 0.7.2's version converter
# (SUPPORTED_MAX_ONNX_OPSET; tests/exporter/routes/test_torch_onnx.py holds it to the installed one).
DYNAMO_MAX_OPSET = 25
TORCHSCRIPT_MIN_OPSET = 7
DYNAMO_BASE_OPSET = 18  # below this the dynamo exporter converts down, and may silently not
TORCHSCRIPT_MAX_OPSET = 20


def _export_dynamo(source, request, dest, args, kwargs, hints):
    torch = sys.modules["torch"]
    FRAMEWORKS["torch"].require("onnxscript")  # its backend
    torch.onnx.export(
        source.model, args, str(dest), kwargs=kwargs, dynamo=True, opset_version=request.opset,
        input_names=source.input_names, output_names=request.output_names or None,
        dynamic_shapes=_dynamic_shapes(torch, source, request.dynamic, bool(kwargs)), external_data=True,
        optimize=True,
    )
    _forget_matched_graphs()
    import onnx

    model = onnx.load(str(dest), load_external_data=False)
    split = request.opset is not None and request.opset < DYNAMO_BASE_OPSET and split_sizes_for_opset(model)
    if name_input_dims(model, request.dynamic) or split:
        onnx.save(model, str(dest))  # the weights stay in the external data file, untouched


def _forget_matched_graphs() -> None:
    """Let go of the exported graph once it is on disk. onnxscript's rewrite rules, which torch.onnx
    optimizes with, are module-level objects whose matchers keep the last graph and match they saw,
    and through them every parameter of the model (also those the optimizer folded into new
    constants): a released source would stay in memory beside the artifact's runtime. The rules
    are found where they are declared, the globals of onnxscript's and torch.onnx's modules (alone
    or in rule sets, lists and tuples), not by walking every object the collector tracks: that
    walk would miss what the collector has set aside (exporter.sources.set_aside_imported_objects)."""
    from onnxscript.rewriter import _matcher, _rewrite_rule

    def matchers(value, depth=0):
        if isinstance(value, _rewrite_rule.RewriteRuleSet):
            for rule in value.rules:
                yield from matchers(rule, depth)
        elif isinstance(value, (list, tuple)) and depth < 2:
            for item in value:
                yield from matchers(item, depth + 1)
        elif isinstance(getattr(value, "_matcher", None), _matcher.PatternMatcher):
            yield value._matcher

    modules = [m for name, m in list(sys.modules.items()) if name.startswith(("onnxscript.", "torch.onnx."))]
    for matcher in (m for module in modules for value in list(vars(module).values()) for m in matchers(value)):
        if hasattr(matcher, "_match"):
            matcher._init_match(0)  # an empty match, no current node
            matcher._graph = matcher._tracer = None


def name_input_dims(model, axes) -> int:
    """Name each dynamic input dimension after its symbol where the exporter named it otherwise
    (torch.export names a dimension it related to others itself: `s53` for the attention mask over
    past and new tokens); returns how many it renamed."""
    dims = {(i.name, k): d for i in model.graph.input for k, d in enumerate(i.type.tensor_type.shape.dim)}
    renamed = 0
    for axis in axes:
        dim = dims.get((axis.input, axis.axis))
        if dim is not None and not dim.HasField("dim_value") and dim.dim_param != axis.symbol:
            dim.dim_param = axis.symbol
            renamed += 1
    return renamed


def split_sizes_for_opset(model) -> int:
    """Rewrite every Split carrying Split-18's num_outputs, in a model below opset 18, to what
    Split-13 (sizes as an input) or Split-2/11 (a `split` attribute) read; returns how many.

    num_outputs=n cuts ceil(d/n)-long chunks and a shorter last one. When d divides evenly the
    attribute is just dropped (the older Split's default is n equal parts); otherwise the sizes
    are written out, d taken from shape inference. A d nothing can infer stays an even split.
    """
    import onnx

    opset = default_opset(model) or DYNAMO_BASE_OPSET
    if opset >= DYNAMO_BASE_OPSET:
        return 0
    nodes = [node for graph in iter_graphs(model.graph) for node in graph.node
             if node.op_type == "Split" and node.domain in ("", "ai.onnx")
             and any(a.name == "num_outputs" for a in node.attribute)]
    if not nodes:
        return 0
    graph = onnx.shape_inference.infer_shapes(model).graph
    dims = {v.name: v.type.tensor_type.shape.dim for v in [*graph.value_info, *graph.input, *graph.output]}
    for node in nodes:
        count = next(a.i for a in node.attribute if a.name == "num_outputs")
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        kept = [a for a in node.attribute if a.name != "num_outputs"]
        del node.attribute[:]
        node.attribute.extend(kept)
        shape = dims.get(node.input[0])
        size = shape[axis].dim_value if shape is not None and -len(shape) <= axis < len(shape) else 0
        if not size or size % count == 0:
            continue
        chunk = -(-size // count)
        sizes = [chunk] * (count - 1) + [size - chunk * (count - 1)]
        if opset >= 13:
            name = f"{node.output[0]}__split_sizes"
            model.graph.initializer.append(onnx.helper.make_tensor(name, onnx.TensorProto.INT64, [count], sizes))
            node.input[1:] = [name]
        else:
            node.attribute.append(onnx.helper.make_attribute("split", sizes))
    return len(nodes)


def _dynamic_shapes(torch, source, axes, by_keyword: bool):
    """torch.export's dynamic_shapes for the dynamic axes: one Dim per symbol (axes that share it
    must be equal), named after it and bounded by its range; keyed by input name for a model
    called by keyword, else one entry per positional input."""
    if not axes:
        return None
    dims = {}
    for axis in axes:
        low, high = dims.get(axis.symbol, (axis.low, axis.high))
        highs = [h for h in (high, axis.high) if h is not None]
        dims[axis.symbol] = (max(low, axis.low), min(highs) if highs else None)
    # a sum of symbols (the attention mask over past and new tokens) is left to torch.export to relate
    made = {symbol: torch.export.Dim.DYNAMIC if parts_of(symbol) else
            torch.export.Dim(symbol, min=low, **({} if high is None else {"max": high}))
            for symbol, (low, high) in dims.items()}
    per_input = {name: {a.axis: made[a.symbol] for a in axes if a.input == name} or None
                 for name in source.input_names}
    return per_input if by_keyword else tuple(per_input.values())


# torch's tracer warns so when model code turns a tensor into a Python number: that number is
# a constant of the trace, and the artifact holds it whatever size it is given.
_TRACED_NUMBER = "Converting a tensor to a Python"


def _export_torchscript(source, request, dest, args, kwargs, hints):
    torch = sys.modules["torch"]
    if is_exported_program(source.model):
        raise Incompatible("the TorchScript exporter cannot take a torch.export program (.pt2)")
    if request.opset is not None and request.opset > TORCHSCRIPT_MAX_OPSET:
        raise Incompatible(f"the TorchScript exporter stops at opset {TORCHSCRIPT_MAX_OPSET}")
    torchscript_symbolics.register_for(request.opset)
    # The TorchScript exporter traces with positional arguments, which breaks forward() signatures
    # like transformers' ("got multiple values for argument 'use_cache'"): call by keyword instead.
    model = keyword_call(source.model, source.input_names) if _takes_keywords(source) else source.model
    if kwargs:
        args, kwargs = tuple(kwargs.values()), None
    dynamic_axes = {}
    for axis in request.dynamic:
        dynamic_axes.setdefault(axis.input, {})[axis.axis] = axis.symbol
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", torch.jit.TracerWarning)
        torch.onnx.export(
            model, args, str(dest), dynamo=False, opset_version=request.opset,
            input_names=source.input_names, output_names=request.output_names or None,
            dynamic_axes=dynamic_axes or None, do_constant_folding=True,
        )
    if request.dynamic:
        hints.extend(_traced_number_hints(torch, caught, source.files))


def _traced_number_hints(torch, caught, own_files) -> list[dict]:
    """One hint per place in the files the model was built from where the tracer turned a tensor
    into a Python number, and one counting those inside installed libraries."""
    own = {str(Path(path).resolve()) for path in own_files}
    places = dict.fromkeys(f"{Path(w.filename).resolve()}:{w.lineno}" for w in caught
                           if issubclass(w.category, torch.jit.TracerWarning)
                           and str(w.message).startswith(_TRACED_NUMBER))
    hints = [{"kind": "traced_number", "location": where, "message": (
        f"{where}: the TorchScript tracer turned a tensor into a Python number; the artifact holds its "
        "export-time value whatever size it is given")} for where in places if where.rpartition(":")[0] in own]
    elsewhere = [where for where in places if where.rpartition(":")[0] not in own]
    if elsewhere:
        hints.append({"kind": "traced_number", "location": elsewhere[0], "message": (
            f"the TorchScript tracer also turned tensors into Python numbers at {len(elsewhere)} place(s) in "
            f"installed libraries (first: {elsewhere[0]})")})
    return hints


def _takes_keywords(source: Source) -> bool:
    import inspect

    try:
        params = inspect.signature(source.model.forward).parameters
    except (TypeError, ValueError):
        return False
    return all(name in params for name in source.input_names)


@functools.cache
def _keyword_call_class():
    torch = sys.modules["torch"]

    class KeywordCall(torch.nn.Module):
        def __init__(self, model, names):
            super().__init__()
            self.model, self.names = model, list(names)
            self.train(model.training)  # torch.onnx restores the wrapper's mode onto the model

        def forward(self, *args):
            return self.model(**dict(zip(self.names, args)))

    return KeywordCall


def keyword_call(model, names):
    """`model` as a module that takes its inputs positionally and passes them on by name."""
    return _keyword_call_class()(model, names)


EXPORTERS = {"dynamo": _export_dynamo, "torchscript": _export_torchscript}


def exporter_order(opset: int | None, choice: str) -> list[str]:
    if choice != "auto":
        return [choice]
    if opset is not None and opset < DYNAMO_BASE_OPSET:
        return ["torchscript", "dynamo"]
    if opset is not None and opset > TORCHSCRIPT_MAX_OPSET:
        return ["dynamo"]
    return ["dynamo", "torchscript"]


class TorchToOnnx(Route):
    framework = "torch"
    format = "onnx"
    exporters = tuple(EXPORTERS)
    quantize_modes = ("int8", "fp16")
    opsets_written_by = (f"the TorchScript exporter {TORCHSCRIPT_MIN_OPSET} to {TORCHSCRIPT_MAX_OPSET}, the dynamo "
                         f"exporter {DYNAMO_BASE_OPSET} converted up to {DYNAMO_MAX_OPSET} by onnxscript")

    def opsets(self) -> tuple[int, int]:
        return TORCHSCRIPT_MIN_OPSET, DYNAMO_MAX_OPSET

    def export(self, source: Source, request: ExportRequest, dest: Path, progress) -> ExportResult:
        check_int8_request(request)
        if request.quantize == "int8":
            return export_int8(lambda path: self._export_float(source, request, path, progress), request, dest, progress)
        if request.quantize == "fp16":
            return export_fp16(lambda path: self._export_float(source, request, path, progress), request, dest,
                               progress)
        return self._export_float(source, request, dest, progress)

    def _export_float(self, source: Source, request: ExportRequest, dest: Path, progress) -> ExportResult:
        torch = FRAMEWORKS["torch"].require("torch")
        args, kwargs = FRAMEWORKS["torch"].example_tensors(source, request.sample_inputs)
        attempts: list[str] = []
        mismatch = False
        for name in exporter_order(request.opset, request.exporter):
            label = f"torch.onnx ({name})"
            progress(f"exporting with {label} at opset {request.opset or 'default'}")
            remove_artifact(dest, "onnx")  # a previous attempt, with the data files it names
            hints: list[dict] = []
            try:
                with quiet_exporter(), _modes_kept(source.model):
                    EXPORTERS[name](source, request, dest, args, kwargs, hints)
            except ExportgateError as exc:
                attempts.append(f"{label} of torch {torch.__version__}: {exc}")
                continue
            except Exception as exc:
                attempts.append(f"{label} of torch {torch.__version__} failed: {_root_cause(exc)}")
                continue
            produced = default_opset(load_structure(dest).model)
            if request.opset is None or produced == request.opset:
                notes = [f"{a}; fell back" for a in attempts]
                bounded = [a for a in request.dynamic if a.low > 1 or a.high is not None]
                if name == "torchscript" and bounded:
                    notes.append(f"the TorchScript exporter takes no ranges: those of --dynamic "
                                 f"{', '.join(f'{a.input}:{a.axis}' for a in bounded)} bound only the sizes verified")
                return ExportResult(exporter=label, notes=notes, hints=hints)
            mismatch = True
            attempts.append(f"{label} produced opset {produced}")
        remove_artifact(dest, "onnx")
        asked = f"asked for opset {request.opset}" if request.opset else "export failed"
        raise Incompatible(f"{asked}: " + "; ".join(attempts), kind="opset" if mismatch else "target")


@contextlib.contextmanager
def _modes_kept(model):
    """Put back every submodule's training flag after an export (the exporters switch modes)."""
    modules = list(model.modules()) if hasattr(model, "modules") else []
    modes = [m.training for m in modules]
    try:
        yield
    finally:
        for module, mode in zip(modules, modes):
            module.training = mode


def _root_cause(exc: BaseException) -> str:
    """One line for an exporter failure: the innermost cause (torch.onnx wraps the real error)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return one_line(exc)
