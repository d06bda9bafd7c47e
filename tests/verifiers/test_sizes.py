"""Which sizes every dynamic axis is verified at (verifiers.sizes): the sizes tried per export size
and range, the plan per symbol, the seeded feeds at other sizes, the symbols read off an
artifact's inputs, and what each symbol's plan reports."""

import numpy as np
import pytest

from verifiers.runtimes import TensorInfo
from verifiers.sizes import (
    DynamicAxis,
    SymbolSizes,
    artifact_axes,
    default_sizes,
    is_dynamic,
    is_padding_mask,
    plan_sizes,
    sized_feed,
    sizes_to_try,
    symbol_of,
)

# ---- sizes_to_try -----------------------------------------------------------------------------


@pytest.mark.parametrize("export, expected", [
    (6, [1, 3, 6, 15]),  # docs/concepts.md's example: 1, the smallest odd prime, 2 x 6 + 3
    (2, [1, 2, 3, 7]),
    (3, [1, 3, 5, 9]),  # 3 is the export size: the prime tried is 5
    (1, [1, 3, 5]),  # 1 is both the export size and the smallest size
    (5, [1, 3, 5, 13]),
])
def test_sizes_to_try_are_the_export_size_one_a_prime_and_a_larger_size(export, expected):
    sizes = sizes_to_try(export)
    assert sizes == expected
    assert export in sizes and sizes == sorted(set(sizes))


def test_sizes_to_try_always_include_an_odd_prime_other_than_the_export_size():
    for export in range(1, 40):
        sizes = sizes_to_try(export)
        primes = [n for n in sizes if n != export and n % 2 and all(n % d for d in range(2, n)) and n > 1]
        assert primes, (export, sizes)
        assert max(sizes) == 2 * export + 3


def test_a_range_moves_every_size_inside_it():
    assert sizes_to_try(6, low=4, high=8) == [4, 5, 6, 8]  # 1 -> 4, the prime from 4 is 5, 15 -> 8
    assert sizes_to_try(6, high=10) == [1, 3, 6, 10]  # high below 2 x export + 3 caps the large size
    assert sizes_to_try(6, low=2) == [2, 3, 6, 15]
    assert sizes_to_try(3, low=1, high=4) == [1, 3, 4]  # prime 5 and 9 both land on 4
    assert sizes_to_try(2, low=2, high=2) == [2]  # a range of one size: nothing else to try
    for low, high in ((4, 8), (1, 10), (2, None), (5, 7)):
        sizes = sizes_to_try(6, low, high)
        assert all(low <= s for s in sizes) and (high is None or all(s <= high for s in sizes))


def test_a_range_above_the_large_size_keeps_the_larger_sizes_inside_it():
    # low above 2 x export + 3: every size but the export's moves up to the range
    sizes = sizes_to_try(2, low=10, high=20)
    assert 2 in sizes and all(s >= 10 for s in sizes if s != 2)
    assert 11 in sizes  # the smallest prime from 10


# ---- plan_sizes -------------------------------------------------------------------------------


def test_two_inputs_sharing_a_symbol_get_one_plan_with_both_axes():
    axes = [DynamicAxis("input_ids", 0, "batch"), DynamicAxis("attention_mask", 0, "batch"),
            DynamicAxis("input_ids", 1, "seq"), DynamicAxis("attention_mask", 1, "seq")]
    feed = {"input_ids": np.zeros((2, 6), np.int64), "attention_mask": np.ones((2, 6), np.int64)}
    plans = {p.symbol: p for p in plan_sizes(axes, feed)}
    assert set(plans) == {"batch", "seq"}
    assert plans["batch"].axes == [axes[0], axes[1]] and plans["seq"].axes == [axes[2], axes[3]]
    assert plans["batch"].export_size == 2 and plans["batch"].sizes == [1, 2, 3, 7]
    assert plans["seq"].export_size == 6 and plans["seq"].sizes == [1, 3, 6, 15]
    assert plans["seq"].extra_sizes == [1, 3, 15]
    assert plans["seq"].where(15) == "input_ids axis 1, attention_mask axis 1 = 15 (export size 6)"


def test_the_ranges_of_a_symbols_axes_intersect():
    axes = [DynamicAxis("a", 1, "seq", low=2, high=12), DynamicAxis("b", 1, "seq", low=4, high=None),
            DynamicAxis("c", 1, "seq", low=1, high=8)]
    feed = {name: np.zeros((1, 6), np.float32) for name in "abc"}
    [plan] = plan_sizes(axes, feed)
    assert (plan.low, plan.high) == (4, 8)
    assert plan.sizes == [4, 5, 6, 8]


def test_a_limit_bounds_every_axis_but_the_batch():
    axes = [DynamicAxis("input_ids", 0, "batch"), DynamicAxis("input_ids", 1, "seq")]
    feed = {"input_ids": np.zeros((6, 6), np.int64)}
    plans = {p.symbol: p for p in plan_sizes(axes, feed, limit=10)}
    assert plans["batch"].sizes == [1, 3, 6, 15]  # the batch is not a position: not bounded
    assert plans["seq"].sizes == [1, 3, 6, 10]
    assert plans["seq"].high is None  # the limit bounds the sizes, not the axis's declared range
    # a declared bound below the limit wins, one above it does not
    tighter = plan_sizes([DynamicAxis("input_ids", 1, "seq", high=8)], feed, limit=10)
    looser = plan_sizes([DynamicAxis("input_ids", 1, "seq", high=12)], feed, limit=10)
    assert tighter[0].sizes == [1, 3, 6, 8] and looser[0].sizes == [1, 3, 6, 10]
    assert plan_sizes(axes, feed)[1].sizes == [1, 3, 6, 15]  # no limit: nothing bounds it


def test_an_axis_of_an_input_the_feed_lacks_is_not_planned():
    axes = [DynamicAxis("x", 0, "batch"), DynamicAxis("missing", 0, "batch"), DynamicAxis("missing", 1, "len")]
    [plan] = plan_sizes(axes, {"x": np.zeros((3, 4), np.float32)})
    assert plan.symbol == "batch" and plan.axes == [axes[0]] and plan.export_size == 3


# ---- sized_feed -------------------------------------------------------------------------------


def _feed():
    rng = np.random.default_rng(7)
    return {
        "input_ids": rng.integers(5, 50, size=(2, 6)).astype(np.int64),
        "attention_mask": np.ones((2, 6), np.int64),
        "flags": np.array([[True, False, True, True, False, True]] * 2),
        "pixels": (rng.standard_normal((2, 3, 4)) * 3 + 10).astype(np.float16),
        "other": rng.standard_normal((5, 6)).astype(np.float32),  # no axis of the symbol
    }


def _seq_plan(feed):
    axes = [DynamicAxis(name, 1, "seq") for name in ("input_ids", "attention_mask", "flags")]
    [plan] = plan_sizes(axes, feed)
    return plan


def test_sized_feed_resizes_exactly_the_symbols_axes_and_keeps_the_rest():
    feed = _feed()
    plan = _seq_plan(feed)
    sized = sized_feed(feed, plan, 11, seed=0)
    assert set(sized) == set(feed)
    assert sized["input_ids"].shape == sized["attention_mask"].shape == sized["flags"].shape == (2, 11)
    # inputs without an axis of the symbol are the very arrays given, bytes and all
    for name in ("pixels", "other"):
        assert sized[name] is feed[name] or sized[name].tobytes() == feed[name].tobytes()
        assert sized[name].shape == feed[name].shape and sized[name].dtype == feed[name].dtype
    # the feed given is not touched
    assert feed["input_ids"].shape == (2, 6)


def test_sized_feed_keeps_values_like_the_inputs_own():
    feed = _feed()
    plan = _seq_plan(feed)
    for size in (1, 3, 15, 64):
        sized = sized_feed(feed, plan, size, seed=3)
        ids = sized["input_ids"]
        assert ids.dtype == np.int64
        assert ids.min() >= feed["input_ids"].min() and ids.max() <= feed["input_ids"].max()  # token ids in range
        assert sized["attention_mask"].dtype == np.int64 and (sized["attention_mask"] == 1).all()
        assert sized["flags"].dtype == np.bool_
    many = sized_feed(feed, plan, 64, seed=3)
    assert len(np.unique(many["input_ids"])) > 5  # seeded values, not a copy of one
    assert set(np.unique(many["flags"])) == {True, False}


def test_sized_feed_of_a_float_input_keeps_its_dtype_mean_and_spread():
    feed = {"x": (np.random.default_rng(0).standard_normal((4, 50)) * 3 + 10).astype(np.float16)}
    [plan] = plan_sizes([DynamicAxis("x", 1, "len")], feed)
    sized = sized_feed(feed, plan, 400, seed=0)["x"]
    assert sized.dtype == np.float16 and sized.shape == (4, 400)
    assert abs(float(sized.astype(np.float64).mean()) - 10) < 1
    assert 2 < float(sized.astype(np.float64).std()) < 4


def test_sized_feed_resizes_several_axes_of_one_input_sharing_a_symbol():
    feed = {"image": np.zeros((1, 3, 8, 8), np.float32)}
    [plan] = plan_sizes([DynamicAxis("image", 2, "side"), DynamicAxis("image", 3, "side")], feed)
    assert sized_feed(feed, plan, 5, seed=0)["image"].shape == (1, 3, 5, 5)


@pytest.mark.parametrize("mask, padding", [
    ([[1, 1, 0, 0], [1, 1, 1, 1]], True),
    ([[True, False], [True, True]], True),
    ([[1, 1], [1, 1]], False),  # no padding: a plain all-ones input
    ([[0, 0, 1, 1], [1, 1, 1, 0]], True),  # padded on the left, and on the right
    ([[1, 0, 1, 0]], False),  # not one run of ones
    ([[0, 1, 1, 0]], False),
    ([[0, 0], [0, 0]], False),
    ([[1.0, 0.0]], False),  # floats are not masks
])
def test_a_padding_mask_is_one_run_of_ones_along_its_last_axis(mask, padding):
    assert is_padding_mask(np.array(mask)) is padding


@pytest.mark.parametrize("example, left_rows", [
    ([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], False),
    ([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], True),
])
def test_a_resized_mask_is_padded_on_the_side_the_examples_rows_are(example, left_rows):
    feed = _feed()
    feed["attention_mask"] = np.array(example, np.int64)
    mask = sized_feed(feed, _seq_plan(feed), 64, seed=3)["attention_mask"]
    padded = mask[~mask.all(axis=-1)]
    assert len(padded) and all(bool(row[0] == 0) is left_rows for row in padded)


def test_a_mask_padded_on_both_sides_gives_rows_padded_on_each():
    feed = _feed()
    feed["attention_mask"] = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], np.int64)
    mask = sized_feed(feed, _seq_plan(feed), 64, seed=3)["attention_mask"]
    padded = mask[~mask.all(axis=-1)]
    assert {bool(row[0] == 0) for row in padded} == {True, False}
    assert mask.any(axis=-1).all()


def test_sized_feed_keeps_a_padding_mask_one_with_a_position_in_every_row():
    """A row with nothing to attend to is where frameworks and exporters legitimately part ways
    (a softmax over nothing): resized masks never have one, and keep their padding."""
    feed = _feed()
    feed["attention_mask"] = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int64)
    plan = _seq_plan(feed)
    for size in (1, 3, 15, 64):
        mask = sized_feed(feed, plan, size, seed=3)["attention_mask"]
        assert mask.shape == (2, size) and mask.dtype == np.int64
        assert mask.any(axis=-1).all() and (np.diff(mask, axis=-1) <= 0).all()
    assert not sized_feed(feed, plan, 64, seed=3)["attention_mask"].all()


def test_sized_feed_is_seeded():
    feed = _feed()
    plan = _seq_plan(feed)
    first, again = sized_feed(feed, plan, 11, seed=4), sized_feed(feed, plan, 11, seed=4)
    assert all(np.array_equal(first[name], again[name]) for name in feed)
    other_seed = sized_feed(feed, plan, 11, seed=5)
    assert not np.array_equal(first["input_ids"], other_seed["input_ids"])
    other_size = sized_feed(feed, plan, 3, seed=4)
    assert other_size["input_ids"].shape == (2, 3) != first["input_ids"].shape


def test_sized_feed_of_an_empty_input_is_zeros_of_its_dtype():
    feed = {"x": np.zeros((0, 4), np.int32)}
    [plan] = plan_sizes([DynamicAxis("x", 1, "len")], feed)
    sized = sized_feed(feed, plan, 7, seed=0)["x"]
    assert sized.shape == (0, 7) and sized.dtype == np.int32


# ---- symbols of an artifact's axes ------------------------------------------------------------


def test_is_dynamic():
    assert all(is_dynamic(d) for d in ("batch", "unk__3", "?", None, -1))
    assert not any(is_dynamic(d) for d in (0, 1, 16))


def test_symbol_of_a_named_dimension_is_its_name_and_of_an_unnamed_one_its_position():
    assert symbol_of("sequence", 1) == "sequence"
    assert symbol_of("batch_size", 0) == "batch_size"
    for unnamed in ("unk__12", "unk__7", None, "?", -1, ""):
        assert symbol_of(unnamed, 0) == "batch"
        assert symbol_of(unnamed, 2) == "dim2"
    assert symbol_of("unknown", 1) == "unknown"  # only tf2onnx's unk__N pattern is unnamed
    assert symbol_of("unk__", 1) == "unk__"


def test_artifact_axes_share_dim_params_across_inputs():
    inputs = [TensorInfo("input_ids", ["batch", "sequence"], "int64"),
              TensorInfo("attention_mask", ["batch", "sequence"], "int64"),
              TensorInfo("pixel_values", ["batch", 3, 224, 224], "float32")]
    axes = artifact_axes(inputs)
    assert axes == [DynamicAxis("input_ids", 0, "batch"), DynamicAxis("input_ids", 1, "sequence"),
                    DynamicAxis("attention_mask", 0, "batch"), DynamicAxis("attention_mask", 1, "sequence"),
                    DynamicAxis("pixel_values", 0, "batch")]
    feed = {"input_ids": np.zeros((2, 6), np.int64), "attention_mask": np.ones((2, 6), np.int64),
            "pixel_values": np.zeros((2, 3, 224, 224), np.float32)}
    plans = {p.symbol: [a.describe() for a in p.axes] for p in plan_sizes(axes, feed)}
    assert plans == {"batch": ["input_ids axis 0", "attention_mask axis 0", "pixel_values axis 0"],
                     "sequence": ["input_ids axis 1", "attention_mask axis 1"]}


def test_tf2onnx_unknown_names_are_unnamed_so_position_decides():
    # tf2onnx names every unknown dimension anew: unk__12 and unk__13 are the same batch
    inputs = [TensorInfo("a", ["unk__12", "unk__13", 4], "float32"),
              TensorInfo("b", ["unk__14", "unk__15"], "float32"),
              TensorInfo("c", [None, "?", 8], "float32")]
    axes = artifact_axes(inputs)
    assert [(a.input, a.axis, a.symbol) for a in axes] == [
        ("a", 0, "batch"), ("a", 1, "dim1"), ("b", 0, "batch"), ("b", 1, "dim1"), ("c", 0, "batch"), ("c", 1, "dim1")]
    assert all((a.low, a.high) == (1, None) for a in axes)


def test_a_tflite_signature_with_minus_one_is_dynamic_at_that_position():
    axes = artifact_axes([TensorInfo("serving_default_x:0", [-1, 10], "float32"),
                          TensorInfo("serving_default_y:0", [1, -1], "float32")])
    assert [(a.input, a.axis, a.symbol) for a in axes] == [("serving_default_x:0", 0, "batch"),
                                                          ("serving_default_y:0", 1, "dim1")]


def test_a_static_artifact_has_no_dynamic_axes():
    assert artifact_axes([TensorInfo("x", [1, 3, 8, 8], "float32"), TensorInfo("s", [], "int64")]) == []


# ---- default_sizes ----------------------------------------------------------------------------


def test_default_sizes_are_distinct_from_two_up_and_repeats_share():
    assert default_sizes(["batch", "sequence", "batch", "dim2", "sequence"]) == {"batch": 2, "sequence": 3, "dim2": 4}
    assert default_sizes([]) == {}
    sizes = default_sizes([f"s{k}" for k in range(10)])
    assert sorted(sizes.values()) == list(range(2, 12))


# ---- SymbolSizes ------------------------------------------------------------------------------


def _plan(**changes):
    axes = [DynamicAxis("x", 1, "seq"), DynamicAxis("mask", 1, "seq")]
    plan = SymbolSizes("seq", axes, 6, 1, None, [1, 3, 6, 15])
    for key, value in changes.items():
        setattr(plan, key, value)
    return plan


def test_a_plan_that_held_at_every_size_passes():
    plan = _plan(max_abs_err={1: 1e-7, 3: 2e-6, 6: 5e-7, 15: 3e-7})
    assert plan.status == "pass"
    assert plan.detail() == "right at sizes 1, 3, 6, 15 (max abs err 2e-06)"
    entries = plan.entries()
    assert [(e["input"], e["axis"]) for e in entries] == [("x", 1), ("mask", 1)]
    assert entries[0] == {"input": "x", "axis": 1, "symbol": "seq", "export_size": 6, "sizes": [1, 3, 6, 15],
                          "range": [1, None], "status": "pass", "detail": plan.detail(),
                          "max_abs_err": {"1": 1e-7, "3": 2e-6, "6": 5e-7, "15": 3e-7}}
    assert entries[1]["status"] == "pass" and entries[1]["sizes"] == [1, 3, 6, 15]


def test_a_plan_that_failed_at_a_size_fails_naming_it():
    plan = _plan(failed={15: "output y: max abs err 0.5 at x axis 1 = 15 (export size 6)"},
                 max_abs_err={1: 0.0, 3: 0.0, 15: 0.5})
    assert plan.status == "fail"
    assert plan.detail() == "15: output y: max abs err 0.5 at x axis 1 = 15 (export size 6)"
    assert {e["status"] for e in plan.entries()} == {"fail"}
    # a failure wins over skipped sizes, both are listed
    plan.skipped = {1: "the source model fails: too short"}
    assert plan.status == "fail"
    assert plan.detail().endswith("; 1 skipped: the source model fails: too short")


def test_a_symbol_static_in_the_artifact_fails_without_sizes():
    plan = _plan(static="declared dynamic, static in the artifact (size 6)")
    assert plan.status == "fail"
    assert plan.detail() == "declared dynamic, static in the artifact (size 6)"
    [entry, _] = plan.entries()
    assert entry["sizes"] == [] and entry["status"] == "fail" and entry["detail"] == plan.static


def test_a_plan_is_skipped_only_when_every_extra_size_was_skipped():
    some = _plan(skipped={1: "the source model fails: needs 2"}, max_abs_err={3: 0.0, 6: 0.0, 15: 0.0})
    assert some.status == "pass"  # 3 and 15 ran
    assert some.detail() == "1 skipped: the source model fails: needs 2"
    every = _plan(skipped={1: "no", 3: "no", 15: "no"})
    assert every.status == "skipped"
    assert every.detail() == "1 skipped: no; 3 skipped: no; 15 skipped: no"
    assert {e["status"] for e in every.entries()} == {"skipped"}
