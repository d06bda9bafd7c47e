"""Tolerances, output matching and error statistics."""

import numpy as np
import pytest

from verifiers.errors import BadInput
from verifiers.compare import Tolerances, compare_outputs, match_outputs


def _compare(ref, art, tolerances=None, name="y"):
    return compare_outputs([name], [name], [(0, 0)], [[ref]], [[art]], tolerances or Tolerances())


def test_defaults_by_dtype_and_overrides():
    t = Tolerances.parse(["logits=1e-5"], ["2e-3"])
    assert (t.for_output("logits", np.float32).atol, t.for_output("logits", np.float32).rtol) == (1e-5, 2e-3)
    assert (t.for_output("other", np.float32).atol, t.for_output("other", np.float32).rtol) == (1e-4, 2e-3)
    assert Tolerances().for_output("ids", np.int64).atol == 0
    with pytest.raises(BadInput, match="--atol 'x=abc'"):
        Tolerances.parse(["x=abc"], [])
    with pytest.raises(BadInput, match="non-negative"):
        Tolerances.parse(["-1"], [])


def test_statistics_and_fraction_out_of_tolerance():
    ref = np.array([1.0, 2.0, 0.0, -4.0], dtype=np.float32)
    art = ref + np.array([0, 0.5, 1e-6, 0], dtype=np.float32)
    [result], [finding] = _compare(ref, art)
    assert result.max_abs_err == pytest.approx(0.5)
    assert result.max_rel_err == pytest.approx(0.25)  # the near-zero reference element is ignored
    assert result.frac_out_of_tol == 0.25 and not result.passed
    assert finding.kind == "numeric" and "max abs err 0.5" in finding.message
    # Errors by decade: two exact matches, 1e-6 (float32: 9.5e-7, in [1e-7, 1e-6)), 0.5 in [0.1, 1).
    edges, counts = result.error_histogram["log10_edges"], result.error_histogram["counts"]
    assert len(counts) == len(edges) + 1 and sum(counts) == 4
    assert counts[0] == 2 and counts[edges.index(-7) + 1] == 1 and counts[edges.index(-1) + 1] == 1


def test_within_tolerance_passes():
    ref = np.linspace(-3, 3, 50, dtype=np.float32)
    [result], findings = _compare(ref, ref + 5e-5)
    assert result.passed and not findings


def test_shape_mismatch_names_both_shapes():
    [result], [finding] = _compare(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    assert not result.passed
    assert "source [2, 3] vs artifact y [3, 2]" in finding.message


def test_nan_is_reported_as_nan_not_as_a_tolerance_miss():
    ref = np.ones(4, np.float32)
    art = ref.copy()
    art[1] = np.nan
    [result], [finding] = _compare(ref, art)
    assert result.nonfinite == {"NaN in artifact": 1}
    assert "NaN/Inf differ at 1 position(s), first in batch 0 at [1]: source 1, artifact NaN" in finding.message


def test_opposite_infinities_differ():
    ref = np.array([1, np.inf, 2], np.float32)
    [result], [finding] = _compare(ref, -ref)
    assert not result.passed
    assert "source +Inf, artifact -Inf" in finding.message


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nonfinite_source_values_fail_unless_allowed_and_matched(value):
    ref = np.array([1, value, 2], np.float32)
    [result], [finding] = _compare(ref, ref.copy())
    assert not result.passed and "the source computes non-finite values" in finding.message
    assert "--allow-nonfinite" in finding.message
    allowed = Tolerances(allow_nonfinite=True)
    [same], findings = compare_outputs(["y"], ["y"], [(0, 0)], [[ref]], [[ref.copy()]], allowed)
    assert same.passed and not findings
    other = ref.copy()
    other[1] = np.nan if not np.isnan(value) else np.inf
    [moved], [finding] = compare_outputs(["y"], ["y"], [(0, 0)], [[ref]], [[other]], allowed)
    assert not moved.passed and "differ at 1 position(s)" in finding.message


def test_an_all_nan_model_fails():
    ref = np.full((2, 3), np.nan, np.float32)
    [result], [finding] = _compare(ref, ref.copy())
    assert not result.passed and "6 NaN in source" in finding.message


def test_matching_by_name_then_by_order():
    assert match_outputs(["a", "b"], True, ["b", "a"]) == [(0, 1), (1, 0)]
    assert match_outputs(["output"], False, ["y"]) == [(0, 0)]
    with pytest.raises(BadInput, match="cannot be matched"):
        match_outputs(["a", "b"], False, ["y"])


def test_a_declared_gelu_change_explains_values_that_differ_and_nothing_else():
    """With every GELU kept or changed as declared, outputs beyond tolerance are noted, not failed;
    a shape, a NaN/Inf where the source has a number, or the source's own NaN are failures still."""
    from verifiers.judging import _accept_declared_differences
    from verifiers.report import Report

    ref = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    cases = {"values": ref + 0.5, "nan": np.array([1.0, np.nan, 3.0], np.float32), "shape": ref[:2]}
    report = Report(command="export")
    for name, art in cases.items():
        report.failures += _compare(ref, art, name=name)[1]
    report.failures += _compare(np.array([np.nan, 1.0], np.float32), np.array([np.nan, 1.0], np.float32),
                                name="source_nan")[1]
    _accept_declared_differences(report)
    assert sorted(f.output for f in report.failures) == ["nan", "shape", "source_nan"]
    assert [n.split(":")[0] for n in report.notes] == ["output values"]
