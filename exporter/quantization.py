"""Full-integer (int8) exports: the options, the calibration data, and the float twin a weak run
is diagnosed against.

How an int8 artifact is judged (its precision, SQNR and top-1, per-layer errors) is the
quantization check's (exporter.checks.quantization) over verifiers/ (verifiers.precision,
verifiers.quantization.metrics, verifiers.quantization.layers).
"""

from __future__ import annotations

from pathlib import Path

from exporter.routes import check_io
from exporter.sources import Source, make_batches
from verifiers.errors import BadInput

CALIBRATION_BATCHES = 8  # seeded random batches when no --calibration is given


def check_integer_options(quantize: str | None, io: str, calibration: str | None, allow_float_ops: bool,
                          keep_fp32: list[str], to: str) -> None:
    """The int8 and fp16 options make sense together, and with the format (before the model loads)."""
    check_io(io, quantize)
    onnx_only = [flag for flag, given in (("--calibration", calibration is not None), ("--keep-fp32", bool(keep_fp32)),
                                          ("--io float16", io == "float16")) if given]
    if quantize == "fp16" and to != "onnx" and onnx_only:
        raise BadInput(f"{onnx_only[0]} applies to ONNX float16 exports: a {to} fp16 export holds float16 weights "
                       "and computes in float32, with nothing to measure or keep; export --to onnx, or leave it out",
                       option=onnx_only[0].split()[0][2:].replace("-", "_"))
    if allow_float_ops and quantize != "int8":
        raise BadInput("--allow-float-ops applies to full-integer exports only: add --quantize int8",
                       option="allow_float_ops")
    if calibration is not None and quantize not in ("int8", "fp16"):
        raise BadInput("--calibration applies to int8 and fp16 exports only: add --quantize int8 or fp16",
                       option="calibration")
    if keep_fp32 and quantize != "fp16":
        raise BadInput("--keep-fp32 applies to float16 exports only: add --quantize fp16", option="keep_fp32")


def calibration_feeds(source: Source, spec: str | None, seed: int, axes=(), data=None) -> tuple[list[dict], dict]:
    """The feeds an int8 export is calibrated on (an ONNX fp16 export's values measured on), and how
    the report describes them: the user's
    --calibration data (sizes along the dynamic `axes` free), `data` ((an exporter.feed_files.DataSet
    of the --data samples it calibrates on, what to call them)), or seeded random batches (a
    different seed from the verification batches')."""
    if spec is None and data is not None:
        samples, called = data
        feeds = [batch.feed for batch in samples.batches_of()]
        return feeds, {"source": called, "batches": len(feeds), "samples": samples.samples, "random": False}
    if spec is not None:
        from exporter.feed_files import load_calibration

        casts: dict[str, str] = {}
        feeds = load_calibration(spec, source.inputs, dynamic={(a.input, a.axis) for a in axes}, casts=casts)
        return feeds, {"source": spec, "batches": len(feeds), "random": False, **({"cast": casts} if casts else {})}
    feeds = make_batches(source, seed + 1, CALIBRATION_BATCHES)
    return feeds, {"source": f"random (seed {seed + 1})", "batches": len(feeds), "random": True}


def cast_calibration_note(calibration: dict) -> str:
    casts = ", ".join(f"{name} {cast}" for name, cast in calibration["cast"].items())
    return (f"--calibration {calibration['source']}: cast to the model's input types ({casts}); values the "
            "narrower type cannot hold are rounded or lost (give data of the model's types)")


def random_calibration_note(calibration: dict) -> str:
    return (f"int8 calibration ran on {calibration['batches']} seeded random batch(es), not on real data: the "
            "ranges it chose, and so this verdict, are no evidence of accuracy on real inputs (give --calibration)")


def float_twin(route, source: Source, request, folder: Path, name: str, progress) -> Path:
    """The same export without quantization, in `folder`: the float model a weak int8 artifact's
    layers are compared with."""
    from dataclasses import replace

    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / name
    float_request = replace(request, quantize=None, io="float", calibration=[], allow_float=False)
    progress("exporting the float model to compare the int8 artifact's layers with")
    route.export(source, float_request, dest, progress)
    return dest
