"""Which sizes each dynamic axis is verified at, and the feeds that carry them.

A dynamic axis belongs to a symbol: axes that share one (one batch over several inputs, the
length of input_ids and of attention_mask) always take the same size. Export and verify make the
same plan: from the axes an export declared, or those of the artifact being verified, and the
feed the export sizes are read from. Each symbol is tried at its export size and at 1, a prime
other than the export size and a larger size (2 x export + 3), inside the axis's range; every
other axis stays at its export size. One seeded batch is made per extra size.

An axis whose symbol is a sum of others (`past_sequence_length + sequence_length`: the attention
mask of a decoder with a KV cache, as exporters name it) is not tried on its own: it grows and
shrinks with each of its parts.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# tf2onnx names every unknown dimension anew (unk__123): such names say nothing about which axes
# move together.
_UNNAMED = re.compile(r"^(unk__\d+|\?|-1|)$")
_SUM = re.compile(r"^[A-Za-z_]\w*( \+ [A-Za-z_]\w*)+$")


def parts_of(symbol: str) -> tuple[str, ...]:
    """The symbols a sum symbol adds up (`past_sequence_length + sequence_length`), else ()."""
    return tuple(symbol.split(" + ")) if _SUM.match(symbol) else ()


@dataclass(frozen=True)
class DynamicAxis:
    """One dynamic axis of one input, its symbol and the sizes it may take (high None: no bound)."""

    input: str
    axis: int
    symbol: str = ""
    low: int = 1
    high: int | None = None

    def describe(self) -> str:
        return f"{self.input} axis {self.axis}"


def is_dynamic(dim: Any) -> bool:
    """Whether a declared dimension is dynamic: an ONNX dim_param or unknown dim, a TFLite -1."""
    return not (isinstance(dim, int) and dim >= 0)


def symbol_of(dim: Any, axis: int) -> str:
    """A dynamic dimension's symbol: its name when it has a meaningful one, else one shared by every
    unnamed dynamic dimension at the same position (axis 0 is the batch)."""
    if isinstance(dim, str) and not _UNNAMED.match(dim):
        return dim
    return "batch" if axis == 0 else f"dim{axis}"


def artifact_axes(inputs: list) -> list[DynamicAxis]:
    """The dynamic axes of an artifact's inputs (verifiers.runtimes TensorInfo records)."""
    return [DynamicAxis(info.name, k, symbol_of(dim, k)) for info in inputs for k, dim in enumerate(info.shape)
            if is_dynamic(dim)]


def default_sizes(symbols: list[str]) -> dict[str, int]:
    """Export sizes for symbols nothing gave a size: distinct, from 2 up, in order of appearance
    (distinct, so that a batch baked into the artifact cannot pass for a baked length)."""
    return {symbol: 2 + k for k, symbol in enumerate(dict.fromkeys(symbols))}


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def sizes_to_try(export: int, low: int = 1, high: int | None = None) -> list[int]:
    """The export size, 1, the smallest odd prime that is not the export size and the larger size
    2 x export + 3, each moved inside [low, high]; ascending, without repeats."""
    cap = 2 * export + 3 if high is None else high
    prime = next(n for n in range(max(low, 3), max(low, 3) + 2 * export + 10) if _is_prime(n) and n != export)
    wanted = (1, prime, 2 * export + 3)
    return sorted({export, *(min(max(size, low), cap) for size in wanted)})


@dataclass
class SymbolSizes:
    """What one symbol is tried at, and what came of each size."""

    symbol: str
    axes: list[DynamicAxis]
    export_size: int
    low: int
    high: int | None
    sizes: list[int]
    skipped: dict[int, str] = field(default_factory=dict)  # size -> why it was not run
    failed: dict[int, str] = field(default_factory=dict)  # size -> the first failure there
    max_abs_err: dict[int, float] = field(default_factory=dict)  # size -> over every output
    static: str | None = None  # why the symbol was not run at all (static in the artifact)
    # axes of a sum symbol with this one among its parts, and their export sizes: they move with it
    derived: list[tuple[DynamicAxis, int]] = field(default_factory=list)

    @property
    def extra_sizes(self) -> list[int]:
        return [size for size in self.sizes if size != self.export_size]

    def where(self, size: int) -> str:
        """`x axis 1 = 11 (export size 6)`; several axes of the symbol are listed together, more
        than three by the symbol: `past_sequence_length (4 axes: past_key_values.0.key axis 2, ...)`."""
        axes = ", ".join(a.describe() for a in self.axes)
        if len(self.axes) > 3:
            axes = f"{self.symbol} ({len(self.axes)} axes: {self.axes[0].describe()}, ...)"
        return f"{axes} = {size} (export size {self.export_size})"

    @property
    def status(self) -> str:
        if self.static is not None or self.failed:
            return "fail"
        return "skipped" if set(self.skipped) >= set(self.extra_sizes) else "pass"

    def detail(self) -> str:
        if self.static is not None:
            return self.static
        parts = [f"{size}: {why}" for size, why in sorted(self.failed.items())]
        parts += [f"{size} skipped: {why}" for size, why in sorted(self.skipped.items())]
        if not parts:
            worst = max(self.max_abs_err.values(), default=0.0)
            return f"right at sizes {', '.join(map(str, self.sizes))} (max abs err {worst:.3g})"
        return "; ".join(parts)

    def entries(self) -> list[dict[str, Any]]:
        """report.dynamic's entries: one per axis of the symbol."""
        return [{"input": a.input, "axis": a.axis, "symbol": self.symbol, "export_size": self.export_size,
                 "sizes": [] if self.static is not None else list(self.sizes), "range": [self.low, self.high],
                 "status": self.status, "detail": self.detail(),
                 "max_abs_err": {str(size): err for size, err in sorted(self.max_abs_err.items())}}
                for a in self.axes]


def undeclared_entry(axis: DynamicAxis) -> dict[str, Any]:
    """report.dynamic's entry for an axis the artifact made dynamic that the export did not declare
    (the source's outputs at other sizes were not computed: it is listed, not run)."""
    return {"input": axis.input, "axis": axis.axis, "symbol": axis.symbol, "export_size": None, "sizes": [],
            "range": [axis.low, axis.high], "status": "skipped", "max_abs_err": {},
            "detail": "dynamic in the artifact but not declared to the export (--dynamic): not run at other sizes"}


def plan_sizes(axes: list[DynamicAxis], feed: dict[str, np.ndarray], limit: int | None = None) -> list[SymbolSizes]:
    """The sizes each symbol of `axes` is tried at: the export size read off `feed`; `limit` (a
    position-embedding length the model states) bounds every axis but the batch."""
    plans: dict[str, SymbolSizes] = {}
    sums = [a for a in axes if parts_of(a.symbol) and a.input in feed]
    for axis in axes:
        if axis.input not in feed or axis in sums:
            continue
        plan = plans.get(axis.symbol)
        if plan is None:
            size = int(feed[axis.input].shape[axis.axis])
            plan = plans[axis.symbol] = SymbolSizes(axis.symbol, [], size, 1, None, [])
        plan.axes.append(axis)
        plan.low = max(plan.low, axis.low)
        if axis.high is not None:
            plan.high = axis.high if plan.high is None else min(plan.high, axis.high)
    for axis in sums:
        for part in parts_of(axis.symbol):
            if part in plans:
                plans[part].derived.append((axis, int(feed[axis.input].shape[axis.axis])))
    for plan in plans.values():
        high = plan.high
        if limit is not None and any(a.axis != 0 for a in plan.axes):
            high = limit if high is None else min(high, limit)
            for _, total in plan.derived:  # the sum must stay within the limit too
                high = min(high, limit - (total - plan.export_size))
        plan.sizes = sizes_to_try(plan.export_size, plan.low, high)
    return list(plans.values())


def sized_feed(feed: dict[str, np.ndarray], plan: SymbolSizes, size: int, seed: int) -> dict[str, np.ndarray]:
    """`feed` with every axis of the symbol at `size`: each input it resizes gets seeded values
    like its own (integers and booleans from the values it holds, so token ids stay in range, and a
    padding mask stays one; floats with its mean and spread); the other inputs are kept."""
    import numpy as np

    rng = np.random.default_rng([seed, size, zlib.crc32(plan.symbol.encode())])
    sizes = {(a.input, a.axis): size for a in plan.axes}
    sizes.update({(a.input, a.axis): total + size - plan.export_size for a, total in plan.derived})
    resized = dict(feed)
    for name, array in feed.items():
        axes = {k: n for (input_name, k), n in sizes.items() if input_name == name}
        if not axes:
            continue
        shape = list(array.shape)
        for k, n in axes.items():
            shape[k] = n
        resized[name] = values_like(array, tuple(shape), rng)
    return resized


def is_padding_mask(array: np.ndarray) -> bool:
    """Whether integer or boolean values are a padding mask with padding in it: 0s and 1s, every
    row (the last axis) one run of ones, padded on the right (ones first) or on the left (zeros
    first), at least one of each in the whole."""
    import numpy as np

    if array.dtype.kind not in "biu" or array.ndim == 0 or array.size == 0:
        return False
    values = array.astype(np.int64)
    if not np.isin(values, (0, 1)).all() or values.all() or not values.any():
        return False
    steps = np.diff(values, axis=-1)
    return bool(np.all((steps <= 0).all(axis=-1) | (steps >= 0).all(axis=-1)))


PADDING_SIDES = ("right", "left")


def padding_sides(mask: np.ndarray) -> tuple[str, ...]:
    """The sides a padding mask's padded rows are padded on (right: ones first), in PADDING_SIDES'
    order."""
    import numpy as np

    rows = mask.astype(np.int64).reshape(-1, mask.shape[-1])
    padded = rows[~rows.all(axis=-1)]
    found = {"right" if row[0] else "left" for row in padded}
    return tuple(side for side in PADDING_SIDES if side in found)


def padding_mask(shape: tuple[int, ...], dtype, rng: np.random.Generator,
                 sides: tuple[str, ...] = ("right",)) -> np.ndarray:
    """A padding mask of `shape`: each row's 1 to all of its positions set (never a row with
    nothing to attend to, where exporters and frameworks legitimately part ways), the rows padded
    on `sides` in turn."""
    import numpy as np

    lengths = rng.integers(1, shape[-1] + 1, size=shape[:-1])
    positions = np.arange(shape[-1])
    right = positions < lengths[..., None]
    left = positions >= shape[-1] - lengths[..., None]
    row = np.arange(int(np.prod(shape[:-1], dtype=np.int64))).reshape(shape[:-1])
    on_left = (np.asarray(sides)[row % len(sides)] == "left")[..., None]
    return np.where(on_left, left, right).astype(dtype)


def values_like(array: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Seeded values of `shape` like `array`'s: integers and booleans from the values it holds, a
    padding mask stays one, floats with its mean and spread."""
    import numpy as np

    if array.size == 0:
        return np.zeros(shape, array.dtype)
    if is_padding_mask(array):
        return padding_mask(shape, array.dtype, rng, padding_sides(array))
    if array.dtype.kind in "biu":
        low, high = array.min(), array.max()
        if array.dtype.kind == "b":
            return rng.choice(np.unique(array), size=shape)
        return rng.integers(int(low), int(high) + 1, size=shape).astype(array.dtype)
    wide = array.astype(np.float64)
    spread = float(wide.std()) or 1.0
    return (rng.standard_normal(shape) * spread + float(wide.mean())).astype(array.dtype)
