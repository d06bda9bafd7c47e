"""The user's own inputs, read from files: calibration data for full-integer (--quantize int8)
exports, and the verification data of --data. One set of readers serves both.

`load_calibration` reads the --calibration spec into feed dicts, each one batch the model runs on,
checked against its inputs. Specs:
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

`DataSet` reads --data: the same specs, every array stacking samples on axis 0 (a folder's .npz
files and a callable's feeds too, each any number of samples), streamed in batches of the
model's batch size: a sample is read when its batch runs, so memory does not grow with the
samples. A dtype other than the input's is refused unless --data-cast (then cast within its kind).
For a transformers model folder, text and images go through its tokenizer and image processor
(exporter.folder_data).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
import contextlib
import zipfile
from pathlib import Path

import numpy as np

from exporter.sources import InputSpec
from verifiers.errors import BadInput, ExportgateError, one_line, raised


def load_calibration(spec: str, specs: list[InputSpec], dynamic: Iterable[tuple[str, int]] = (),
                     casts: dict[str, str] | None = None) -> list[dict[str, np.ndarray]]:
    """The feeds `spec` holds, each checked against `specs` (cast to the inputs' dtypes within
    a kind, each cast recorded in `casts` as {input: "float64 -> float32"}); `dynamic`: (input,
    axis) pairs whose size may differ from the spec's."""
    where, attr = _located(spec, CALIBRATION)
    if attr is not None:
        feeds = [(feed, f"{where}:{attr}") for feed in _from_callable(where, attr, CALIBRATION)]
    elif where.is_dir():
        feeds = _from_folder(where, specs)
    else:
        feeds = [(feed, str(where)) for feed in _stacked(_read_npz(where, CALIBRATION), specs, where)]
    if not feeds:
        raise BadInput(f"--calibration {spec}: no calibration batches in it")
    flexible = set(dynamic)
    checked = [_checked(feed, specs, flexible, origin) for feed, origin in feeds]
    if casts is not None:
        casts.update({name: f"{feed[name].dtype.name} -> {checked_feed[name].dtype.name}"
                      for (feed, _), checked_feed in zip(feeds, checked) for name in checked_feed
                      if np.asarray(feed[name]).dtype != checked_feed[name].dtype})
    return checked


CALIBRATION, DATA = "--calibration", "--data"  # the options whose files these readers read


def _located(spec: str, option: str) -> tuple[Path, str | None]:
    """Where `spec` points: (file.py, callable) or (a .npz file or a folder, None)."""
    path_text, sep, attr = spec.rpartition(":")
    if sep and path_text.endswith(".py"):
        return Path(path_text), attr
    where = Path(spec)
    if where.is_dir() or (where.suffix == ".npz" and where.is_file()):
        return where, None
    if not where.exists():
        raise BadInput(f"{option} {spec}: no such file or folder")
    raise BadInput(f"{option} {spec}: expected PATH.npz, a folder of .npz/.npy files or file.py:callable")


def _read_npz(path: Path, option: str = CALIBRATION) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except Exception as exc:
        raise BadInput(f"{option} {path}: unreadable .npz: {one_line(exc)}") from exc


def _read_npy(path: Path, option: str = CALIBRATION) -> np.ndarray:
    """A .npy file's array; never unpickled."""
    try:
        return np.load(path, allow_pickle=False)
    except Exception as exc:
        raise BadInput(f"{option} {path}: unreadable .npy: {one_line(exc)}") from exc


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


def _from_callable(path: Path, attr: str, option: str) -> Iterator[dict[str, np.ndarray]]:
    """The feeds a user's file.py:callable returns or yields, one at a time, imported as model
    files are (exporter.frameworks)."""
    from exporter.frameworks import user_callable

    function = user_callable(path, attr, f"{option} {path}")
    try:
        for i, feed in enumerate(function()):
            if not isinstance(feed, dict):
                raise BadInput(f"{option} {path}:{attr}: item {i} is a {type(feed).__name__}, "
                               "expected a dict {input name: array}")
            yield {name: np.asarray(value) for name, value in feed.items()}
    except ExportgateError:
        raise
    except Exception as exc:
        raise BadInput(f"{option} {path}:{attr}() raised {raised(exc)}") from exc


def _kind(dtype: np.dtype) -> str:
    return {"f": "float", "i": "integer", "u": "integer", "b": "bool"}.get(dtype.kind, dtype.name)


def _describe(dtype, shape) -> str:
    return f"{dtype} of shape {'x'.join(str(d) for d in shape) or 'scalar'}"


def _checked(feed: dict, specs: list[InputSpec], dynamic: set[tuple[str, int]], origin: str,
             option: str = CALIBRATION) -> dict[str, np.ndarray]:
    """`feed` checked against the inputs `specs` and cast to their dtypes within a kind."""
    dtypes = _valid(feed, specs, dynamic, origin, option)
    return {name: np.ascontiguousarray(feed[name], dtype=dtype) for name, dtype in dtypes.items()}


def _valid(feed: dict, specs: list[InputSpec], dynamic: set[tuple[str, int]], origin: str, option: str,
           cast: bool = True, samples_first: bool = False) -> dict[str, np.dtype]:
    """Each input's dtype, once `feed` (arrays, or anything with their shape and dtype) is found
    to hold exactly the inputs `specs`, of their kinds, ranks and sizes. `cast`: a dtype of the
    input's kind will do (float64 for a float32 input), else only the input's own; `samples_first`:
    axis 0 counts samples, of any size."""
    names = [s.name for s in specs]
    unknown = [name for name in feed if name not in names]
    if unknown:
        raise BadInput(f"{option} {origin}: unknown input {unknown[0]!r} (the model's inputs: {', '.join(names)})")
    dtypes = {}
    for spec in specs:
        if spec.name not in feed:
            raise BadInput(f"{option} {origin}: input {spec.name!r} is missing (expected {spec.describe()})")
        array = feed[spec.name]
        dtype = np.dtype("float32" if spec.dtype == "bfloat16" else spec.dtype)
        shape_ok = array.ndim == len(spec.shape) and all(
            found == wanted or (spec.name, axis) in dynamic or (samples_first and axis == 0)
            for axis, (found, wanted) in enumerate(zip(array.shape, spec.shape)))
        expected = _describe(spec.dtype, ["N", *spec.shape[1:]] if samples_first else spec.shape)
        found = _describe(array.dtype, array.shape)
        if _kind(array.dtype) != _kind(dtype) or not shape_ok:
            raise BadInput(f"{option} {origin}: input {spec.name!r}: expected {expected}, found {found}")
        if array.dtype != dtype and not cast:
            raise BadInput(f"{option} {origin}: input {spec.name!r}: expected {expected}, found {found} "
                           f"(give --data-cast to cast it)")
        dtypes[spec.name] = dtype
    return dtypes


@dataclass
class DataBatch:
    """One batch of --data: the feed, and the numbers of the samples its rows hold (samples count
    from 0 in the data's order); rows past them repeat them to fill a static batch."""

    feed: dict[str, np.ndarray]
    numbers: list[int]

    @property
    def count(self) -> int:
        return len(self.numbers)


@dataclass
class DataSet:
    """The samples --data names (see the module's docstring), checked against the model's inputs
    `specs` by `scan`, then streamed by `batches_of`. `dynamic`: (input, axis) pairs whose size may
    differ between samples; `cast`: --data-cast; `part`: (n, k) keeps the samples whose number is
    k modulo n (an int8 export calibrates on some samples and verifies on the others)."""

    spec: str
    specs: list[InputSpec]
    dynamic: set[tuple[str, int]] = field(default_factory=set)
    cast: bool = False
    folder: Path | None = None  # a transformers model folder: text and images go through its processing
    part: tuple[int, int] | None = None
    padding_side: str | None = None  # text padded on this side (None: as the folder's tokenizer pads)
    truncated: list[int] = field(default_factory=list)  # text samples cut to the export's length
    samples: int = 0
    batches: int = 0
    filled: int = 0  # samples repeated to fill the last batch of a run of equal shapes
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # each input's min and max
    shapes: list[dict[str, list[int]]] = field(default_factory=list)  # the distinct batch shapes, by input

    @property
    def batch_size(self) -> int:
        sizes = {spec.shape[0] for spec in self.specs if spec.shape}
        if len(sizes) != 1 or any(not spec.shape for spec in self.specs):
            found = ", ".join(f"{spec.name} {spec.describe()}" for spec in self.specs)
            raise BadInput(f"{DATA} {self.spec}: every input needs axis 0 as its batch, of one size ({found})")
        return sizes.pop()

    def scan(self) -> None:
        """Read every sample once, checking it: counts, value ranges and shapes for the report; a
        bad file is BadInput naming it, the input and what is wrong, before anything runs."""
        self.samples = self.batches = self.filled = 0
        self.ranges, self.shapes, self.truncated = {}, [], []
        for batch in self.batches_of(self.truncated):
            self.batches += 1
            self.samples += batch.count
            self.filled += self.batch_size - batch.count
            shapes = {name: list(array.shape) for name, array in batch.feed.items()}
            if shapes not in self.shapes:
                self.shapes.append(shapes)
            for name, array in batch.feed.items():
                if array.size:
                    low, high = float(array.min()), float(array.max())
                    old = self.ranges.get(name, (low, high))
                    self.ranges[name] = (min(old[0], low), max(old[1], high))
        if not self.samples:
            raise BadInput(f"{DATA} {self.spec}: no samples in it" + (" for this part" if self.part else ""))

    def batches_of(self, truncated: list[int] | None = None) -> Iterator[DataBatch]:
        """The samples in batches of the model's batch size, in order; consecutive samples of the
        same shape share a batch, and a batch they cannot fill repeats its own samples (text
        samples cut to the export's length are appended to `truncated`)."""
        size = self.batch_size
        pending: list[dict[str, np.ndarray]] = []
        numbers: list[int] = []
        number = 0  # of the next sample read
        for stack, origin in self._stacks(truncated):
            stack = {name: _one_sample_stacked(array, self.specs, name) for name, array in stack.items()}
            dtypes = _valid(stack, self.specs, self.dynamic, origin, DATA, self.cast, samples_first=True)
            counts = {array.shape[0] for array in stack.values()}
            if len(counts) != 1:
                found = ", ".join(f"{name} {array.shape[0]}" for name, array in stack.items())
                raise BadInput(f"{DATA} {origin}: the inputs hold different numbers of samples ({found})")
            count = counts.pop()
            if pending and _sample_shapes(pending[0]) != _sample_shapes(stack):
                yield _filled(pending, numbers, size)
                pending, numbers = [], []
            for start in range(0, count, size):  # read in slices of a batch at most
                rows = np.arange(start, min(start + size, count))
                kept = rows if self.part is None else rows[(number + rows) % self.part[0] == self.part[1]]
                sliced = {name: np.array(stack[name][start:start + len(rows)], dtype=dtype)
                          for name, dtype in dtypes.items()}
                for row in kept:
                    pending.append({name: array[row - start:row - start + 1] for name, array in sliced.items()})
                    numbers.append(number + int(row))
                    if len(numbers) == size:
                        yield DataBatch(_joined(pending), numbers)
                        pending, numbers = [], []
            number += count
        if pending:
            yield _filled(pending, numbers, size)

    def _stacks(self, truncated: list[int] | None = None) -> Iterator[tuple[dict[str, np.ndarray], str]]:
        """Each array group of the spec as stored, samples on axis 0, read when it is reached."""
        from exporter import folder_data

        text, images = Path(self.spec), folder_data.images_in(Path(self.spec))
        if folder_data.is_text(text) or images:
            if self.folder is None:
                raise BadInput(f"{DATA} {self.spec}: text and images go through a transformers model folder's "
                               "tokenizer or image processor, and the model is not one: give its inputs in an .npz")
            if images:
                yield from folder_data.image_stacks(images, self.folder, self.specs, self.batch_size)
            else:
                yield from folder_data.text_stacks(text, self.folder, self.specs, self.batch_size, self.dynamic,
                                                   [] if truncated is None else truncated, self.padding_side)
            return
        where, attr = _located(self.spec, DATA)
        if attr is not None:
            for k, feed in enumerate(_from_callable(where, attr, DATA)):
                yield feed, f"{where}:{attr} item {k}"
            return
        if not where.is_dir():
            yield from _npz_stack(where)
            return
        files = sorted(p for p in where.iterdir() if p.suffix in (".npz", ".npy"))
        kinds = {p.suffix for p in files}
        names = {s.name for s in self.specs}
        per_input = [p for p in files if p.suffix == ".npy" and p.stem in names]
        if len(kinds) > 1 or (per_input and len(per_input) != len(files)):
            raise BadInput(f"{DATA} {where}: a folder of one kind of file: .npz files (each samples of every input), "
                           f".npy files named after the inputs, or one .npy per sample of a one-input model")
        if per_input:
            yield from _npy_stack({p.stem: p for p in per_input}, where)
            return
        for path in files:
            if path.suffix == ".npz":
                yield from _npz_stack(path)
            elif len(self.specs) != 1:
                raise BadInput(f"{DATA} {path}: a .npy file must be named after an input of this "
                               f"{len(self.specs)}-input model ({', '.join(s.name for s in self.specs)})")
            else:
                yield from _npy_stack({self.specs[0].name: path}, path)

    def text_padding(self) -> dict[str, str] | None:
        """How text samples are padded (folder_data.text_padding); None for arrays and images."""
        from exporter import folder_data

        if self.folder is None or not folder_data.is_text(Path(self.spec)):
            return None
        return folder_data.text_padding(self.folder, Path(self.spec), self.padding_side)

    def files(self) -> list[Path]:
        """The files the data is read from (the callable's: its module)."""
        from exporter import folder_data

        images = folder_data.images_in(Path(self.spec))
        if images:
            return images
        if folder_data.is_text(Path(self.spec)):
            return [Path(self.spec)]
        where, _ = _located(self.spec, DATA)
        if where.is_dir():
            return sorted(p for p in where.iterdir() if p.suffix in (".npz", ".npy"))
        return [where]


def _filled(pending: list[dict], numbers: list[int], size: int) -> DataBatch:
    """The pending samples as a batch, repeated to `size` rows."""
    feed = _joined(pending)
    if len(numbers) < size:
        repeat = np.arange(size) % len(numbers)
        feed = {name: array[repeat] for name, array in feed.items()}
    return DataBatch(feed, numbers)


def _sample_shapes(feed: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {name: array.shape[1:] for name, array in feed.items()}


def _joined(pieces: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(pieces) == 1:
        return {name: np.ascontiguousarray(array) for name, array in pieces[0].items()}
    return {name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]}


def _one_sample_stacked(array, specs: list[InputSpec], name: str):
    """An array of one sample (the input's rank less its batch axis) as a stack of one."""
    rank = next((len(spec.shape) for spec in specs if spec.name == name), None)
    if rank is None or array.ndim != rank - 1:
        return array
    return (array.one_sample() if isinstance(array, _Rows) else np.asarray(array))[None]


def _npz_stack(path: Path) -> Iterator[tuple[dict, str]]:
    """A .npz file's arrays, each read front to back as its samples are reached (a zip member is
    streamed, never read whole)."""
    try:
        with zipfile.ZipFile(path) as archive:
            yield {name.removesuffix(".npy"): _Rows(archive.open(name), f"{path}: {name}")
                   for name in archive.namelist() if name.endswith(".npy")}, str(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise BadInput(f"{DATA} {path}: unreadable .npz: {one_line(exc)}") from exc


def _npy_stack(paths: dict[str, Path], where: Path) -> Iterator[tuple[dict, str]]:
    """.npy files by input name, each read front to back as its samples are reached."""
    with contextlib.ExitStack() as files:
        try:
            rows = {name: _Rows(files.enter_context(open(path, "rb")), str(path)) for name, path in paths.items()}
        except (OSError, ValueError) as exc:
            raise BadInput(f"{DATA} {where}: unreadable .npy: {one_line(exc)}") from exc
        yield rows, str(where)


class _Rows:
    """An array stored in the .npy format (a file, or a member of a .npz): its shape and dtype
    from the header, its rows read in order by slices along axis 0, never all at once."""

    def __init__(self, file, origin: str):
        self._file = file
        version = np.lib.format.read_magic(file)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(file)
        if dtype.hasobject:
            raise BadInput(f"{DATA} {origin}: holds Python objects, which exportgate never unpickles: save arrays "
                           "of numbers")
        if fortran and len(shape) > 1:
            raise BadInput(f"{DATA} {origin}: stored in Fortran order: save np.ascontiguousarray of it")
        self.shape, self.dtype, self.ndim = tuple(shape), dtype, len(shape)
        self._row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        self._next = 0

    def one_sample(self) -> np.ndarray:
        """The whole array, read now (a file of one sample, without its batch axis)."""
        count = int(np.prod(self.shape, dtype=np.int64))
        return np.frombuffer(self._file.read(count * self.dtype.itemsize), self.dtype).reshape(self.shape)

    def __getitem__(self, rows: slice) -> np.ndarray:
        if not self.shape:
            raise BadInput("a scalar array has no samples")
        start, stop = rows.start, min(rows.stop, self.shape[0])
        assert start == self._next, "rows are read in order"
        data = self._file.read((stop - start) * self._row)
        self._next = stop
        return np.frombuffer(data, dtype=self.dtype).reshape((stop - start, *self.shape[1:]))
