"""--quantize int8 for both ONNX routes: the float export, then onnxruntime's static quantization.

The route exports float into a temporary folder beside the destination (removed afterwards, also
on failure); quant_pre_process (shape inference, ORT's graph optimisations) prepares it and
quantize_static writes the QDQ artifact at the destination. Where quant_pre_process fails (its
symbolic shape inference stops on transformers graphs the TorchScript exporter writes:
"Incomplete symbolic shape inference"), the ways onnxruntime documents are taken in turn, and
the report's notes say which: again without symbolic shape inference (skip_symbolic_shape), then
no preparation at all (quantize_static takes a float model as it is). The artifact is:
per-channel int8 weights, int8 activations (symmetric-range int8 as the TFLite routes and TensorRT/ARM kernels take them; ORT
runs S8S8 QDQ on every CPU), MinMax ranges over the calibration feeds. op_types_to_quantize
lists every op type of the graph but the shape-only ones: ORT quantizes a type outside its QDQ
registry with its default handler (QDQOperatorBase: a Q/DQ pair on each float input and output),
so no op is left float because ORT's list skips it. ForceQuantizeNoInputCheck makes the handlers
that quantize an op only after its inputs (Where, pools, Resize) quantize it anyway: a Where
choosing between two constants (transformers' attention mask) would stay float otherwise.

A float model with external data (past protobuf's 2 GiB) is read with it and the artifact is
written with its own external data file beside it. QDQ artifacts take and give float: --io int8
and uint8 are refused.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable

from exporter.routes import ExportRequest, ExportResult, int8_result
from exporter.staging import companion_files, remove_artifact
from verifiers.errors import BadInput, Incompatible, one_line
from verifiers.onnx_model import iter_nodes
from verifiers.quiet import quiet_exporter

# Ops that compute no float value from their float inputs (they read a shape or hold a constant).
SHAPE_ONLY_OPS = frozenset({"Shape", "Size", "Constant"})


def check_onnx_int8(request: ExportRequest) -> None:
    if request.quantize == "int8" and request.io != "float":
        raise BadInput(f"--io {request.io}: ONNX int8 exports are QDQ graphs, which take and give float "
                       "(QuantizeLinear/DequantizeLinear at the edges); use --io float")


# quant_pre_process's options, tried in this order until one prepares the model (onnxruntime's
# documented fallback for graphs its symbolic shape inference cannot follow), what each skips, and
# how report.quantization["preparation"] names it ("none": the float model quantized as it is).
PREPARATIONS = (
    ({}, None, "quant_pre_process"),
    ({"skip_symbolic_shape": True}, "symbolic shape inference", "quant_pre_process(skip_symbolic_shape=True)"),
)


def export_int8(export_float: Callable[[Path], ExportResult], request: ExportRequest, dest: Path,
                progress) -> ExportResult:
    """`export_float(path)` writes the float model at `path`; its QDQ int8 quantization is written
    at `dest`, and the float model removed."""
    check_onnx_int8(request)
    dest = Path(dest)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}.float-", dir=dest.parent) as folder:
        float_path = Path(folder).resolve() / dest.name
        result = export_float(float_path)
        try:
            method, preparation, notes = quantize_onnx(float_path, dest, request.calibration, progress)
        except BaseException:
            remove_artifact(dest, "onnx")
            raise
    result.notes.extend(notes)
    result.quantization = {**int8_result(request, method, dest, "onnx"), "preparation": preparation}
    return result


def prepare(float_path: Path, prepared: Path, large: bool, label: str, progress) -> tuple[Path, str, list[str]]:
    """The float model prepared for quantization by quant_pre_process, the first of PREPARATIONS
    that succeeds, else `float_path` itself (`large`: its weights lie in external data); the
    preparation's name, and a note when the first failed."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    notes, failures = [], []
    for options, skipped, name in PREPARATIONS:
        progress(f"preparing the float model for quantization ({label} quant_pre_process"
                 + (f", {skipped} skipped)" if skipped else ")"))
        try:
            # Its symbolic shape inference saves the model it gave up on into the working
            # directory (sym_shape_infer_temp.onnx and its data): that is the scratch folder here.
            with quiet_exporter(), _working_directory(float_path.parent):
                quant_pre_process(str(float_path), str(prepared), save_as_external_data=large,
                                  all_tensors_to_one_file=True, external_data_location=f"{prepared.name}.data",
                                  **options)
        except Exception as exc:  # noqa: BLE001 - the next documented preparation is tried
            failures.append(one_line(exc))
            remove_artifact(prepared, "onnx")
            continue
        if failures:
            notes.append(f"int8: {label} quant_pre_process failed ({failures[0]}); the model was prepared "
                         f"without {skipped}, as onnxruntime documents")
        return prepared, name, notes
    notes.append(f"int8: {label} quant_pre_process failed with and without symbolic shape inference "
                 f"({failures[-1]}); the float model was quantized without preparation, as onnxruntime allows "
                 "(tensors of unknown shape may stay float)")
    return float_path, "none", notes


@contextlib.contextmanager
def _working_directory(folder: Path):
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def quantize_onnx(float_path: Path, dest: Path, feeds: list[dict], progress) -> tuple[str, str, list[str]]:
    """Quantize the float model at `float_path` into `dest` (QDQ, int8); returns what quantized,
    how the model was prepared (PREPARATIONS' names, or "none"), and a note when quant_pre_process's
    defaults failed."""
    import onnx
    import onnxruntime
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    large = bool(companion_files(float_path, "onnx"))
    label = f"onnxruntime.quantization {onnxruntime.__version__}"
    prepared, preparation, notes = prepare(float_path, float_path.with_name(f"prepared-{float_path.name}"), large,
                                           label, progress)
    model = onnx.load(str(prepared), load_external_data=False)
    inputs = [v.name for v in model.graph.input if v.name not in {t.name for t in model.graph.initializer}]
    op_types = sorted({node.op_type for node in iter_nodes(model.graph)} - SHAPE_ONLY_OPS)
    progress(f"calibrating on {len(feeds)} batch(es) and quantizing to int8 ({label} quantize_static, QDQ)")
    try:
        with quiet_exporter():
            quantize_static(
                str(prepared), str(dest), _Reader(feeds, inputs), quant_format=QuantFormat.QDQ,
                op_types_to_quantize=op_types, per_channel=True, weight_type=QuantType.QInt8,
                activation_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                use_external_data_format=large, extra_options={"ForceQuantizeNoInputCheck": True},
            )
    except Exception as exc:
        raise Incompatible(f"{label} quantize_static failed: {one_line(exc)}") from exc
    return (f"{label} quantize_static (QDQ, per-channel int8 weights, int8 activations, MinMax calibration "
            f"on {len(feeds)} batch(es))"), preparation, notes


class _Reader:
    """An onnxruntime CalibrationDataReader (which checks for get_next only) over the feeds, keyed
    by the model's input names."""

    def __init__(self, feeds: list[dict], inputs: list[str]):
        missing = sorted(set(inputs) - set(feeds[0]))
        if missing:
            raise Incompatible(f"the float ONNX model takes {', '.join(missing)}, which the calibration feeds "
                               f"do not hold (they hold {', '.join(feeds[0])})")
        self._feeds = iter([{name: feed[name] for name in inputs} for feed in feeds])

    def get_next(self):
        return next(self._feeds, None)
