"""Input specs and verification batches."""

import numpy as np
import pytest

from exporter.frameworks import load_source
from verifiers.errors import BadInput
from exporter.sources import (
    InputSpec,
    make_batches,
    parse_dynamic_axis,
    parse_input_spec,
)
from fixtures.specs import torch_model


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
