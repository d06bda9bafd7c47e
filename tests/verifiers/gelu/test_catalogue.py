"""The flavour catalogue: references, probe placement, thresholds and classification."""

import math

import numpy as np
import pytest

from verifiers.gelu.catalogue import (
    EXACT,
    FLAVOURS,
    IDENTITY,
    QUICK,
    RELU,
    SILU,
    SQRT_2_OVER_PI,
    TANH,
    TANH_CUBIC_COEFF,
    UNKNOWN,
    exact,
    quick,
    tanh,
)
from verifiers.gelu.classification import (
    FLOAT16_TOLERANCE,
    FLOAT32_TOLERANCE,
    PROBES,
    classify,
    is_gelu_shaped,
    probe_inputs,
    residuals,
    tail_probes,
)


def tanh_with(cubic: float, x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(SQRT_2_OVER_PI * (x + cubic * x**3)))


def float32_exact(x: np.ndarray) -> np.ndarray:
    """0.5*x*(1+erf(x/sqrt2)) with every step rounded to float32 (1+erf cancels in the tail)."""
    x = x.astype(np.float32)
    erf = np.array([math.erf(v) for v in x / np.float32(math.sqrt(2))], dtype=np.float32)
    return np.float32(0.5) * x * (np.float32(1) + erf)


def test_catalogue_names_every_flavour_and_only_unknown_lacks_a_reference():
    assert set(FLAVOURS) == {EXACT, TANH, QUICK, RELU, IDENTITY, SILU, UNKNOWN}
    assert [name for name, f in FLAVOURS.items() if f.reference is None] == [UNKNOWN]
    assert all(f.description for f in FLAVOURS.values())


@pytest.mark.parametrize(
    ("flavour", "x", "expected"),
    [(EXACT, 1.0, 0.8413447461), (TANH, 1.0, 0.8411919906), (QUICK, 1.0, 0.8457957659),
     (EXACT, -3.0, -4.0497e-3), (TANH, -3.0, -3.6374e-3), (EXACT, -5.0, -1.4333e-6), (TANH, -5.0, -2.2918e-7)],
)
def test_references_reproduce_the_published_values(flavour, x, expected):
    assert FLAVOURS[flavour].reference(np.array([x]))[0] == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize(
    ("curve", "nearest", "distance"),
    [(tanh, EXACT, 4.73e-4), (quick, EXACT, 2.03e-2), (exact, RELU, 0.170),
     (lambda x: tanh_with(0.0447, x), TANH, 8.7e-6)],
)
def test_probes_sit_where_the_flavours_differ_most(curve, nearest, distance):
    """The probe set sees the full distance measured on a dense [-10, 10] grid."""
    assert residuals(PROBES, curve(PROBES))[nearest] == pytest.approx(distance, rel=0.02)


@pytest.mark.parametrize("flavour", [EXACT, TANH, QUICK, RELU, IDENTITY])
def test_each_reference_classifies_as_itself(flavour):
    result = classify(PROBES, FLAVOURS[flavour].reference(PROBES))
    assert (result.flavour, result.confident) == (flavour, True)
    assert result.residuals[flavour] == 0.0


@pytest.mark.parametrize("flavour", [TANH, QUICK])
def test_float32_evaluation_still_classifies_as_the_flavour(flavour):
    x = PROBES.astype(np.float32)
    y = FLAVOURS[flavour].reference(x).astype(np.float32)
    assert classify(x, y).flavour == flavour


def test_float32_exact_with_erf_cancellation_error_still_classifies_as_exact():
    x = PROBES.astype(np.float32)
    assert classify(x, float32_exact(x)).flavour == EXACT
    # The documented worst float32 error (6.8e-7) on every probe, with either sign.
    wobble = 7e-7 * np.where(np.arange(PROBES.size) % 2, 1.0, -1.0)
    assert classify(PROBES, exact(PROBES) + wobble).flavour == EXACT


def test_tolerance_sits_between_float32_noise_and_the_0_0447_typo():
    assert 7e-7 * 4 < FLOAT32_TOLERANCE < 8.7e-6 / 2


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tanh_with_0_0447_typo_is_unknown_not_tanh(dtype):
    x = PROBES.astype(dtype)
    result = classify(x, tanh_with(0.0447, x.astype(np.float64)).astype(dtype))
    assert (result.flavour, result.confident) == (UNKNOWN, True)
    assert 8e-6 < result.residuals[TANH] < 9.5e-6
    assert "tanh" in result.note


def test_quick_with_1_7_is_unknown():
    result = classify(PROBES, PROBES / (1 + np.exp(-1.7 * PROBES)))
    assert (result.flavour, result.confident) == (UNKNOWN, True)


def test_silu_is_a_flavour_of_its_own_and_not_gelu_shaped():
    result = classify(PROBES, PROBES / (1 + np.exp(-PROBES)))
    assert (result.flavour, result.confident) == (SILU, True)
    assert not is_gelu_shaped(result.residuals)


def test_float16_cannot_separate_exact_from_tanh_but_can_see_quick():
    x = PROBES.astype(np.float16)
    ambiguous = classify(x, exact(x).astype(np.float16), FLOAT16_TOLERANCE)
    assert ambiguous.flavour in (EXACT, TANH) and not ambiguous.confident
    resolved = classify(x, quick(x).astype(np.float16), FLOAT16_TOLERANCE)
    assert (resolved.flavour, resolved.confident) == (QUICK, True)


def test_nan_outputs_count_as_infinitely_far():
    y = exact(PROBES)
    y[3] = np.nan
    result = classify(PROBES, y)
    assert result.residuals[EXACT] == math.inf and result.flavour == UNKNOWN


def test_output_count_must_match_probe_count():
    with pytest.raises(ValueError, match="outputs for"):
        classify(PROBES, exact(PROBES)[:-1])


def test_formula_constants_are_exported():
    assert SQRT_2_OVER_PI == pytest.approx(0.7978845608, abs=1e-10)
    assert TANH_CUBIC_COEFF == 0.044715
    assert FLAVOURS[QUICK].reference(np.array([1.0]))[0] == pytest.approx(1 / (1 + math.exp(-1.702)))


def test_a_flavour_is_recognised_up_to_a_constant_scale():
    x = probe_inputs(np.float32)
    result = classify(x, (2.0 * tanh(x)).astype(np.float32))
    assert (result.flavour, result.confident) == (TANH, True)
    assert result.scale == pytest.approx(2.0, rel=1e-6) and "2 x tanh" in result.note


def test_probes_reach_the_tails_where_field_bugs_live():
    assert tail_probes(np.float32).min() == -1e4 and tail_probes(np.float32).max() == 1e4
    assert tail_probes(np.float16).max() == 6e4  # float16 overflows at 65504
    assert {-13.0, -20.0, 100.0} <= set(tail_probes(np.float32))


@pytest.mark.parametrize(("broken", "named"), [
    (lambda x, y: np.where(x < -13, np.nan, y), "NaN at x=-10000"),  # a tanh kernel's NaN below -13
    (lambda x, y: np.where(x > 10, np.inf, y), "Inf at x=13"),  # an overflowing x^3
    (lambda x, y: np.minimum(y, 10.0), "10 at x=13"),  # saturates at the wrong value
])
def test_a_broken_tail_is_unknown_and_named(broken, named):
    x = probe_inputs(np.float32)
    result = classify(x, broken(x, tanh(x)).astype(np.float32))
    assert (result.flavour, result.confident) == (UNKNOWN, True)
    assert result.tail.startswith(named.split(" at ")[0]) and named in result.tail
    assert "tanh on the core probes" in result.note


def test_a_faithful_tail_passes_in_float32_and_float16():
    for dtype, tolerance in ((np.float32, FLOAT32_TOLERANCE), (np.float16, FLOAT16_TOLERANCE)):
        x = probe_inputs(dtype)
        assert classify(x, exact(x).astype(dtype), tolerance).tail == ""


def test_one_record_per_flavour_says_how_it_is_written_and_claimed():
    from verifiers.gelu.catalogue import claim_for, claimed_by, flavour, gelu20_flavour
    from verifiers.formats.onnx.gelu_writer import CONSTANTS, FORMS

    assert {(f.name, form) for f in FLAVOURS.values() for form in f.forms} == set(FORMS)
    assert {f.name: f.gelu20_approximate for f in FLAVOURS.values() if f.gelu20_approximate} == {
        EXACT: "none", TANH: "tanh"}
    assert gelu20_flavour("tanh") == TANH and gelu20_flavour("fast") is None
    assert [claimed_by("onnx", f"com.microsoft.{op}")[0].name for op in ("Gelu", "FastGelu", "BiasGelu", "QuickGelu")] \
        == [EXACT, TANH, EXACT, QUICK]
    assert claimed_by("onnx", "com.microsoft.Relu") is None
    assert claimed_by("tflite", "GELU", {"approximate": True})[0].name == TANH
    assert claimed_by("torch", "aten.gelu.default", {"approximate": "none"})[0].name == EXACT
    assert claim_for(TANH, "keras", "gelu").attr("approximate") is True
    assert all(CONSTANTS[key] == value for f in FLAVOURS.values() for key, value in f.constants.items())
    with pytest.raises(KeyError, match="no flavour 'fast'"):
        flavour("fast")


def test_the_catalogue_imports_with_the_standard_library_only():
    import sys
    from pathlib import Path

    from fixtures.children import run_child

    code = ("import sys; import verifiers.gelu.catalogue as c; c.FLAVOURS; "
            "print(sorted(m for m in ('numpy', 'onnx', 'onnxruntime') if m in sys.modules))")
    result = run_child([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3], timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


# ---- what transformers configs declare -------------------------------------------------------


def _transformers_claims():
    from verifiers.gelu.catalogue import TRANSFORMERS

    return [(claim.op, f.name) for f in FLAVOURS.values() for claim in f.claims if claim.framework == TRANSFORMERS]


@pytest.mark.parametrize("name, claimed", _transformers_claims())
def test_each_activation_name_a_config_declares_computes_its_claimed_flavour(name, claimed):
    """transformers' own activation for the name (ACT2FN), measured: its curve is the flavour's."""
    import torch
    from transformers.activations import ACT2FN

    from verifiers.gelu.classification import classify

    x = np.linspace(-6, 6, 1201)
    y = ACT2FN[name](torch.tensor(x, dtype=torch.float64)).numpy()
    assert np.max(np.abs(y - FLAVOURS[claimed].reference(x))) < 1e-6
    assert classify(x.astype(np.float32), y.astype(np.float32)).flavour == claimed


def test_a_config_declares_its_activations_at_any_depth_and_unclaimed_names_are_left_out():
    from verifiers.gelu.configured import declared_by

    declared = declared_by({"hidden_act": "gelu_new", "text_config": {"hidden_act": "quick_gelu"},
                            "vision_config": {"activation_function": "mish"}, "projector_hidden_act": "gelu"})
    assert declared.to_dict() == {"hidden_act": {"name": "gelu_new", "flavour": "tanh"},
                                  "text_config.hidden_act": {"name": "quick_gelu", "flavour": "quick"},
                                  "projector_hidden_act": {"name": "gelu", "flavour": "exact"}}
    assert declared.flavours == {"tanh", "quick", "exact"}
    assert declared_by({"hidden_act": "silu"}).flavours == set()
