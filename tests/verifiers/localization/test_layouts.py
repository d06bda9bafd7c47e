"""How an artifact tensor may hold a source tensor's values, matching by value, and weights' owners."""

import numpy as np
import pytest

from verifiers.localization.layouts import Layout, ValueIndex, layouts, max_abs
from verifiers.localization.weights import owner

RNG = np.random.default_rng(0)


def _perms(found: list[Layout]) -> list[tuple[int, ...]]:
    return [layout.perm for layout in found]


def test_equal_shapes_hold_the_values_as_they_are_only():
    assert _perms(layouts((2, 8, 32), (2, 8, 32))) == [(0, 1, 2)]


def test_merged_or_split_axes_are_the_identity_and_cut_ones_are_no_layout():
    assert _perms(layouts((2, 8, 32), (1, 16, 32)))[0] == (0, 1, 2)  # a fully connected op's [batch*seq, hidden]
    assert _perms(layouts((2, 8, 32), (2, 8, 2, 16)))[0] == (0, 1, 2)  # heads split off
    assert all(not layout.identity for layout in layouts((6, 4), (4, 6)))  # 6x4 read as 4x6 cuts across rows
    assert layouts((2, 3), (7,)) == []


def test_nhwc_holds_nchw_transposed():
    nchw = RNG.standard_normal((2, 8, 5, 5))
    found = layouts(nchw.shape, (2, 5, 5, 8))
    assert (0, 2, 3, 1) in _perms(found)
    layout = next(layout for layout in found if layout.perm == (0, 2, 3, 1))
    assert np.array_equal(layout.to_artifact(nchw), nchw.transpose(0, 2, 3, 1))


def test_axes_of_equal_size_keep_their_order():
    """Keys laid out (batch, heads, dim, seq) are a layout of (batch, heads, seq, dim); with batch
    and heads both 2, the same with batch and heads swapped holds other values."""
    found = _perms(layouts((2, 2, 8, 16), (2, 2, 16, 8)))
    assert (0, 1, 3, 2) in found and (1, 0, 3, 2) not in found


def test_the_artifacts_dialect_is_tried_where_the_shapes_are_equal():
    assert _perms(layouts((1, 8, 8, 8), (1, 8, 8, 8), frozenset({(0, 2, 3, 1)}))) == [(0, 1, 2, 3), (0, 2, 3, 1)]


def test_values_are_found_under_a_layout_and_not_when_swapped():
    keys = RNG.standard_normal((2, 2, 8, 16)).astype(np.float32)
    index = ValueIndex({"keys": keys, "other": RNG.standard_normal((2, 2, 8, 16)).astype(np.float32)})
    transposed = np.ascontiguousarray(keys.transpose(0, 1, 3, 2))
    assert [m[0] for m in index.match(transposed + 1e-7)] == ["keys"]
    assert index.match(np.ascontiguousarray(keys.transpose(1, 0, 3, 2))) == []
    assert index.match(keys * 1.01) == []  # 1% is not rounding


def test_float32_lowest_stands_for_minus_infinity():
    masked = np.array([0.0, -np.inf, 1.0])
    assert max_abs(np.array([0.0, np.finfo(np.float32).min, 1.0]), masked) == 0.0
    assert max_abs(np.array([0.0, 0.0, 1.0]), masked) == np.inf


@pytest.mark.parametrize("stored", [
    lambda w: w * 0.5,  # an attention scale folded in
    lambda w: (w * np.linspace(0.8, 1.2, w.shape[1])).T,  # a LayerNorm's scale folded, stored transposed
    lambda w: w.T,  # a fault that transposed it
])
def test_weights_are_owned_by_the_module_whose_parameter_they_are(stored):
    query, key = RNG.standard_normal((16, 16)), RNG.standard_normal((16, 16))
    assert owner((stored(query),), {"attention.query": [query], "attention.key": [key]}) == "attention.query"


def test_unrelated_weights_have_no_owner():
    assert owner((RNG.standard_normal((16, 16)),), {"attention.query": [RNG.standard_normal((16, 16))]}) is None
