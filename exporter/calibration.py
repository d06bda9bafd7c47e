"""Calibration data for full-integer (--quantize int8) exports: `load_calibration` reads the
--calibration spec into feed dicts, each one batch the model runs on, checked against its inputs.

Specs:
- PATH.npz: one array per input, named after it. Axis 0 stacks samples, as a dataset does
  (np.savez("calib.npz", image=images) with images of shape N x 3 x 224 x 224): they are cut
  into consecutive batches of the input's batch size (its axis-0 size), which is what
  TFLiteConverter's representative_dataset and onnxruntime's CalibrationDataReader are handed
  one at a time. N must be a multiple of the batch size and give every input the same number of
  batches. A scalar input's array is one batch.
- FOLDER: every .npz in it is one feed (arrays of the inputs' shapes, no cutting); `<input>.npy`
  files are stacks cut into batches as in a PATH.npz; for a one-input model, any other .npy files
  are one batch each. Files are read in name order.
- file.py:callable: called without arguments, it returns or yields feed dicts ({input name:
  array}), each one batch.

Every feed must name exactly the model's inputs, with data of the input's kind (floating point for
float inputs, integers for integer ones such as token ids: a value of the other kind is refused,
never cast), rank and sizes; sizes may differ only on the axes given as dynamic.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from exporter.sources import InputSpec
from verifiers.errors import BadInput, one_line, raised


def load_calibration(spec: str, specs: list[InputSpec], dynamic: Iterable[tuple[str, int]] = (),
                     casts: dict[str, str] | None = None) -> list[dict[str, np.ndarray]]:
    """The feeds `spec` holds, each checked against `specs` (cast to the inputs' dtypes within
    a kind, each cast recorded in `casts` as {input: "float64 -> float32"}); `dynamic`: (input,
    axis) pairs whose size may differ from the spec's."""
    path_text, sep, attr = spec.rpartition(":")
    if sep and path_text.endswith(".py"):
        where = Path(path_text)
        feeds = [(feed, f"{where}:{attr}") for feed in _from_callable(where, attr)]
    else:
        where = Path(spec)
        if where.is_dir():
            feeds = _from_folder(where, specs)
        elif where.suffix == ".npz" and where.is_file():
            feeds = [(feed, str(where)) for feed in _stacked(_read_npz(where), specs, where)]
        elif not where.exists():
            raise BadInput(f"--calibration {spec}: no such file or folder")
        else:
            raise BadInput(f"--calibration {spec}: expected PATH.npz, a folder of .npz/.npy files or file.py:callable")
    if not feeds:
        raise BadInput(f"--calibration {spec}: no calibration batches in it")
    flexible = set(dynamic)
    checked = [_checked(feed, specs, flexible, origin) for feed, origin in feeds]
    if casts is not None:
        casts.update({name: f"{feed[name].dtype.name} -> {checked_feed[name].dtype.name}"
                      for (feed, _), checked_feed in zip(feeds, checked) for name in checked_feed
                      if np.asarray(feed[name]).dtype != checked_feed[name].dtype})
    return checked


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except Exception as exc:
        raise BadInput(f"--calibration {path}: unreadable .npz: {one_line(exc)}") from exc


def _read_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except Exception as exc:
        raise BadInput(f"--calibration {path}: unreadable .npy: {one_line(exc)}") from exc


def _stacked(arrays: dict[str, np.ndarray], specs: list[InputSpec], where: Path) -> list[dict[str, np.ndarray]]:
    """Cut arrays that stack samples on axis 0 into batches of each input's batch size."""
    by_name = {s.name: s for s in specs}
    counts = {}
    for name, array in arrays.items():
        spec = by_name.get(name)
        if spec is None or array.ndim != len(spec.shape):
            _checked(arrays, specs, set(), str(where))  # raises, naming the input
        if not spec.shape:
            counts[name] = 1
            continue
        batch = spec.shape[0]
        if array.shape[0] % batch:
            raise BadInput(f"--calibration {where}: input {name!r}: {array.shape[0]} samples on axis 0 are not a "
                           f"multiple of its batch size {batch}")
        counts[name] = array.shape[0] // batch
    if len(set(counts.values())) > 1:
        found = ", ".join(f"{name} {count}" for name, count in counts.items())
        raise BadInput(f"--calibration {where}: the inputs give different numbers of batches ({found})")
    count = next(iter(counts.values()), 0)
    if count == 1:
        return [arrays]
    return [{name: array[i * by_name[name].shape[0]:(i + 1) * by_name[name].shape[0]]
             for name, array in arrays.items()} for i in range(count)]


def _from_folder(folder: Path, specs: list[InputSpec]) -> list[tuple[dict, str]]:
    feeds = [(_read_npz(path), str(path)) for path in sorted(folder.glob("*.npz"))]
    npy = sorted(folder.glob("*.npy"))
    names = {s.name for s in specs}
    per_input = {path.stem: path for path in npy if path.stem in names}
    others = [path for path in npy if path.stem not in names]
    if per_input:
        where = next(iter(per_input.values())) if len(per_input) == 1 else folder / f"{{{','.join(sorted(per_input))}}}.npy"
        stacked = {name: _read_npy(path) for name, path in per_input.items()}
        feeds += [(feed, str(where)) for feed in _stacked(stacked, specs, where)]
    if others:
        if len(specs) != 1:
            raise BadInput(f"--calibration {others[0]}: a .npy file must be named after an input of this "
                           f"{len(specs)}-input model ({', '.join(s.name for s in specs)})")
        feeds += [({specs[0].name: _read_npy(path)}, str(path)) for path in others]
    return feeds


def _from_callable(path: Path, attr: str) -> list[dict]:
    """The feeds a user's file.py:callable returns or yields, imported as model files are
    (exporter.frameworks)."""
    from exporter.frameworks import user_callable

    function = user_callable(path, attr, f"--calibration {path}")
    try:
        feeds = list(function())
    except Exception as exc:
        raise BadInput(f"--calibration {path}:{attr}() raised {raised(exc)}") from exc
    for i, feed in enumerate(feeds):
        if not isinstance(feed, dict):
            raise BadInput(f"--calibration {path}:{attr}: item {i} is a {type(feed).__name__}, "
                           "expected a dict {input name: array}")
    return [{name: np.asarray(value) for name, value in feed.items()} for feed in feeds]


def _kind(dtype: np.dtype) -> str:
    return {"f": "float", "i": "integer", "u": "integer", "b": "bool"}.get(dtype.kind, dtype.name)


def _describe(dtype, shape) -> str:
    return f"{dtype} of shape {'x'.join(str(d) for d in shape) or 'scalar'}"


def _checked(feed: dict, specs: list[InputSpec], dynamic: set[tuple[str, int]], origin: str) -> dict[str, np.ndarray]:
    names = [s.name for s in specs]
    unknown = [name for name in feed if name not in names]
    if unknown:
        raise BadInput(f"--calibration {origin}: unknown input {unknown[0]!r} (the model's inputs: {', '.join(names)})")
    checked = {}
    for spec in specs:
        if spec.name not in feed:
            raise BadInput(f"--calibration {origin}: input {spec.name!r} is missing (expected {spec.describe()})")
        array = feed[spec.name]
        dtype = np.dtype("float32" if spec.dtype == "bfloat16" else spec.dtype)
        shape_ok = array.ndim == len(spec.shape) and all(
            found == wanted or (spec.name, axis) in dynamic
            for axis, (found, wanted) in enumerate(zip(array.shape, spec.shape)))
        if _kind(array.dtype) != _kind(dtype) or not shape_ok:
            raise BadInput(f"--calibration {origin}: input {spec.name!r}: expected {_describe(spec.dtype, spec.shape)}, "
                           f"found {_describe(array.dtype, array.shape)}")
        checked[spec.name] = np.ascontiguousarray(array, dtype=dtype)
    return checked
