"""Input specs and verification batches."""

import numpy as np
import pytest

from exporter.frameworks import load_source
from verifiers.errors import BadInput
from exporter.sources import (
    InputSpec,
    make_batches,
    name_symbols,
    parse_dynamic_axis,
    parse_input_spec,
    specs_of_tensors,
    stated_length_limit,
)
from fixtures.specs import torch_model
from verifiers.runtimes import TensorInfo
from verifiers.sizes import DynamicAxis


def test_parse_input_spec():
    assert parse_input_spec("input_ids:2x16:int64:0..1000") == InputSpec("input_ids", (2, 16), "int64", 0, 1000)
    assert parse_input_spec("x:1x3x8x8:float32") == InputSpec("x", (1, 3, 8, 8), "float32")
    for bad in ("x", "x:2x3", "x:2x3:float99", "x:0x3:float32", "x:2:int64:5..1"):
        with pytest.raises(BadInput):
            parse_input_spec(bad)


def test_parse_dynamic_axis():
    assert parse_dynamic_axis("input_ids:1").axis == 1
    with pytest.raises(BadInput, match="NAME:AXIS"):
        parse_dynamic_axis("input_ids")


def test_batches_reach_the_gelu_range_and_integers_stay_in_range():
    source = load_source(torch_model("keyword_inputs"), [parse_input_spec("input_ids:2x5:int64:0..100")])
    batches = make_batches(source, seed=0, count=3)
    assert len(batches) == 4  # the example, then three random batches
    ids = np.concatenate([b["input_ids"].ravel() for b in batches[1:]])
    assert ids.min() >= 0 and ids.max() < 100
    scale = np.concatenate([b["scale"].ravel() for b in batches[1:]])
    assert np.abs(scale).max() >= 3
    again = make_batches(source, seed=0, count=3)
    assert all(np.array_equal(a["scale"], b["scale"]) for a, b in zip(batches, again))


# ---- dynamic axes: --dynamic NAME:AXIS[:MIN..MAX], their symbols and the model's stated limit ----


def test_parse_dynamic_axis_reads_a_range():
    assert parse_dynamic_axis("input_ids:1") == DynamicAxis("input_ids", 1, "", 1, None)
    assert parse_dynamic_axis("x:1:4..8") == DynamicAxis("x", 1, low=4, high=8)
    assert parse_dynamic_axis("x:1:..8") == DynamicAxis("x", 1, low=1, high=8)
    assert parse_dynamic_axis("x:1:4..") == DynamicAxis("x", 1, low=4, high=None)
    assert parse_dynamic_axis("x:0:3..3") == DynamicAxis("x", 0, low=3, high=3)
    # the name may hold colons (a TensorFlow tensor name); the axis is what follows the last one
    assert parse_dynamic_axis("serving_default_x:0:1") == DynamicAxis("serving_default_x:0", 1)
    assert parse_dynamic_axis("serving_default_x:0:1:2..9") == DynamicAxis("serving_default_x:0", 1, low=2, high=9)


@pytest.mark.parametrize("bad, match", [
    ("x", "NAME:AXIS"),
    ("x:", "NAME:AXIS"),
    (":1", "NAME:AXIS"),
    ("x:-1", "NAME:AXIS"),
    ("x:1:4-8", "NAME:AXIS"),
    ("x:1:a..b", "NAME:AXIS"),
    ("x:1:8..4", "1 <= MIN <= MAX"),
    ("x:1:0..4", "1 <= MIN <= MAX"),
    ("x:1:0..", "1 <= MIN <= MAX"),
])
def test_parse_dynamic_axis_refuses_what_is_not_an_axis_or_a_range(bad, match):
    with pytest.raises(BadInput, match=match) as caught:
        parse_dynamic_axis(bad)
    assert f"--dynamic {bad!r}" in str(caught.value)


def test_axes_at_the_same_position_and_export_size_share_a_symbol():
    feed = {"input_ids": np.zeros((2, 6), np.int64), "attention_mask": np.ones((2, 6), np.int64),
            "token_type_ids": np.zeros((2, 6), np.int64)}
    axes = name_symbols([parse_dynamic_axis(t) for t in (
        "input_ids:0", "input_ids:1", "attention_mask:0", "attention_mask:1", "token_type_ids:1")], feed)
    assert [(a.input, a.axis, a.symbol) for a in axes] == [
        ("input_ids", 0, "batch"), ("input_ids", 1, "dim1"), ("attention_mask", 0, "batch"),
        ("attention_mask", 1, "dim1"), ("token_type_ids", 1, "dim1")]


def test_axes_at_the_same_position_with_other_export_sizes_get_their_own_symbols():
    feed = {"a": np.zeros((2, 6)), "b": np.zeros((2, 4)), "c": np.zeros((3, 4))}
    axes = name_symbols([DynamicAxis("a", 1), DynamicAxis("b", 1), DynamicAxis("c", 1),
                         DynamicAxis("a", 0), DynamicAxis("c", 0)], feed)
    symbols = {(a.input, a.axis): a.symbol for a in axes}
    assert symbols[("a", 1)] == "dim1"
    assert symbols[("b", 1)] == symbols[("c", 1)] == "dim1_b"  # both 4 long: one symbol, not a's
    assert symbols[("a", 0)] == "batch" and symbols[("c", 0)] == "batch_c"
    assert len({symbols[("a", 1)], symbols[("b", 1)], symbols[("a", 0)], symbols[("c", 0)]}) == 4


def test_a_named_keras_axis_is_joined_by_a_dynamic_axis_at_its_position_and_size():
    # A Keras None dimension comes named (symbol_of(None, 1) == "dim1") at its default size, 3.
    feed = {"tokens": np.zeros((2, 3), np.int64), "mask": np.ones((2, 3), np.int64), "extra": np.zeros((2, 5))}
    keras = [DynamicAxis("tokens", 0, "batch"), DynamicAxis("tokens", 1, "dim1")]
    axes = name_symbols([*keras, DynamicAxis("mask", 1), DynamicAxis("mask", 0), DynamicAxis("extra", 1)], feed)
    symbols = {(a.input, a.axis): a.symbol for a in axes}
    assert symbols[("mask", 1)] == "dim1" and symbols[("mask", 0)] == "batch"
    assert symbols[("extra", 1)] == "dim1_extra"  # position 1, but 5 long: "dim1" is taken
    # a named axis keeps its name even where an unnamed one came first
    feed = {"first": np.zeros((2, 7)), "tokens": np.zeros((2, 3))}
    axes = name_symbols([DynamicAxis("first", 1), DynamicAxis("tokens", 1, "dim1")], feed)
    symbols = {(a.input, a.axis): a.symbol for a in axes}
    assert symbols == {("first", 1): "dim1_first", ("tokens", 1): "dim1"}


def test_the_same_axis_given_twice_is_one_axis_within_both_ranges():
    feed = {"x": np.zeros((2, 6))}
    [axis] = name_symbols([parse_dynamic_axis("x:1:2..12"), parse_dynamic_axis("x:1:4..")], feed)
    assert axis == DynamicAxis("x", 1, "dim1", 4, 12)
    [axis] = name_symbols([parse_dynamic_axis("x:1:..10"), parse_dynamic_axis("x:1:..8")], feed)
    assert (axis.low, axis.high) == (1, 8)
    # a Keras-named axis given again with --dynamic keeps its name and takes the range
    [axis] = name_symbols([DynamicAxis("x", 1, "dim1"), parse_dynamic_axis("x:1:3..9")], feed)
    assert axis == DynamicAxis("x", 1, "dim1", 3, 9)


def test_specs_of_tensors_give_each_symbol_its_own_size_and_shared_symbols_one():
    tensors = [TensorInfo("input_ids", ["batch", "sequence"], "int64"),
               TensorInfo("attention_mask", ["batch", "sequence"], "int64"),
               TensorInfo("pixels", [None, 3, "unk__5", "unk__6"], "float32"),
               TensorInfo("scale", [], "float32")]
    specs = {s.name: s for s in specs_of_tensors(tensors)}
    assert specs["input_ids"] == InputSpec("input_ids", (2, 3), "int64")
    assert specs["attention_mask"] == InputSpec("attention_mask", (2, 3), "int64")
    assert specs["pixels"] == InputSpec("pixels", (2, 3, 4, 5), "float32")  # batch 2; dim2 4, dim3 5
    assert specs["scale"] == InputSpec("scale", (), "float32")
    assert list(specs) == ["input_ids", "attention_mask", "pixels", "scale"]


def test_specs_of_a_static_artifact_are_its_shapes():
    specs = specs_of_tensors([TensorInfo("x", [1, 3, 8, 8], "float32"), TensorInfo("k", [4], "int32")])
    assert specs == [InputSpec("x", (1, 3, 8, 8), "float32"), InputSpec("k", (4,), "int32")]


def test_a_transformers_model_states_its_length_limit():
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    bert = BertModel(BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=16, max_position_embeddings=24))
    assert stated_length_limit(bert) == 24
    gpt2 = GPT2Model(GPT2Config(vocab_size=32, n_embd=8, n_layer=1, n_head=2, n_positions=20))
    assert stated_length_limit(gpt2) == 20


def test_a_model_without_a_stated_length_has_no_limit():
    import torch

    assert stated_length_limit(torch.nn.Linear(2, 2)) is None
    assert stated_length_limit(object()) is None

    class KerasHubLike:
        max_sequence_length = 128

    assert stated_length_limit(KerasHubLike()) == 128

    class Unset:
        class config:
            max_position_embeddings = None
            n_positions = 0

    assert stated_length_limit(Unset()) is None


def test_a_range_that_does_not_hold_the_export_size_or_does_not_overlap_is_bad_input():
    feed = {"x": np.zeros((2, 6)), "y": np.zeros((2, 6))}
    with pytest.raises(BadInput, match="export size 6 is outside"):
        name_symbols([parse_dynamic_axis("x:1:8..16")], feed)
    with pytest.raises(BadInput, match="do not overlap"):
        name_symbols([parse_dynamic_axis("x:1:1..3"), parse_dynamic_axis("x:1:5..8")], feed)
