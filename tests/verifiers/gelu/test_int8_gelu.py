"""The GELU guard on full-integer artifacts: TFLite int8 GELU lookup tables measured on every input
code, ONNX QDQ sites measured in float with the resolution of the QuantizeLinear after them, and
the verdict at that resolution (verifiers.gelu.int8)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixtures import make_broken_tflite as mbt
from fixtures.make_broken_int8 import full_integer_tflite
from verifiers.gelu import EXACT, QUICK, RELU, TANH
from verifiers.gelu.catalogue import Site
from verifiers.gelu.site_flavour import SiteFlavour
from verifiers.gelu.int8 import Int8Grid, classify_table
from verifiers.formats.onnx.gelu_inventory import onnx_inventory
from verifiers.formats.tflite.gelu_inventory import tflite_inventory
from verifiers.gelu.verdict import CHANGED, INDISTINGUISHABLE, KEPT, judge

EXACT_TANH_GAP = 4.73e-4  # max |exact - tanh| (x = +-2.70)


def _source(flavour: str) -> list[SiteFlavour]:
    return [SiteFlavour(Site("0:src", "gelu", flavour, ("src",), "in", "out"), flavour)]


def _verdict(flavour: str, artifact: list[SiteFlavour]):
    (verdict,) = judge(_source(flavour), artifact)
    return verdict


# ---- the rule on its own ---------------------------------------------------------------------------


def test_table_is_the_kernels_formula():
    """quantize(f(dequantize(q))), rounded half away from zero, clamped to the type's range."""
    grid = Int8Grid("int8", 0.01, -100, 0.05, 0)
    x = grid.inputs()
    assert (x[0], x[-1]) == pytest.approx((-6.4, 6.35))
    table = grid.table(EXACT)
    assert table[list(x).index(1.0)] == round(0.8413447461 / 0.01) - 100
    assert table.min() == -100 - 17 and table.max() == 127  # GELU's minimum -0.17; 6.35 / 0.01 - 100 clamps
    assert classify_table(grid, table).table_differences[EXACT] == 0


@pytest.mark.parametrize("scale, zero, alike", [
    (0.01, -112, {TANH}),  # a usual GELU output step: tanh under it, quick (2e-2) above
    (0.03, -112, {TANH, QUICK}),  # a coarse one hides quick too
    (3e-4, 127, set()),  # the negative branch alone, finely: exact and tanh apart
])
def test_what_a_grid_cannot_tell_from_exact(scale, zero, alike):
    grid = Int8Grid("int8", scale, zero, 0.025, 0 if zero < 0 else 127)
    unresolved = grid.unresolved(EXACT, [TANH, QUICK, RELU])
    assert set(unresolved) == alike
    if TANH in alike:
        assert unresolved[TANH] == pytest.approx(EXACT_TANH_GAP, rel=0.05) and unresolved[TANH] < scale


# ---- TFLite full integer ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def int8_tflite(tmp_path_factory):
    """convert(activation, bias=0.0) -> bytes of Dense -> activation -> Dense, full-integer PTQ
    (TFLITE_BUILTINS_INT8, seeded representative dataset), cached per module."""
    folder, cache = tmp_path_factory.mktemp("int8_tflite"), {}

    def convert(activation: str, bias: float = 0.0) -> bytes:
        key = (activation, bias)
        if key not in cache:
            import keras

            keras.utils.set_random_seed(0)
            inputs = keras.Input((16,))
            hidden = keras.layers.Dense(16, bias_initializer=keras.initializers.Constant(bias))(inputs)
            act = {"exact": lambda h: keras.activations.gelu(h, approximate=False),
                   "tanh": lambda h: keras.activations.gelu(h, approximate=True),
                   "relu": keras.activations.relu}[activation]
            model = keras.Model(inputs, keras.layers.Dense(8)(act(hidden)))
            rng = np.random.default_rng(0)
            cache[key] = full_integer_tflite(model, [rng.standard_normal((1, 16)).astype(np.float32)
                                                     for _ in range(16)])
        return cache[key]

    def inventory(content: bytes, name: str):
        path = folder / f"{name}.tflite"
        path.write_bytes(content)
        return tflite_inventory(path)

    convert.inventory = inventory
    return convert


@pytest.mark.parametrize("flavour, other", [(EXACT, TANH), (TANH, EXACT)])
def test_int8_gelu_is_a_lut_exact_and_tanh_alike(int8_tflite, flavour, other):
    """Keras gelu(approximate=False/True) -> int8 GELU v2: the op's table is its flavour's, entry for
    entry; at its output step (~0.01) the other flavour's table differs only by one step in a few
    entries, so the site is indistinguishable, neither kept nor changed."""
    (entry,) = int8_tflite.inventory(int8_tflite(flavour), flavour)
    assert (entry.site.op, entry.flavour, entry.measured, entry.confident) == ("GELU", flavour, flavour, True)
    assert entry.int8.dtype == "int8" and 0.005 < entry.int8.output_scale < 0.05
    assert entry.table_differences[flavour] == 0 and 0 < entry.table_differences[other] < 16
    assert entry.table_differences[QUICK] > 64 and entry.table_differences[RELU] > 128
    verdict = _verdict(flavour, [entry])
    assert verdict.status == INDISTINGUISHABLE and not verdict.failed
    assert list(verdict.unresolved) == [other]
    assert verdict.gap == pytest.approx(EXACT_TANH_GAP, rel=0.05) and verdict.gap < entry.int8.output_scale
    report = verdict.to_dict()
    assert report["status"] == INDISTINGUISHABLE and report["resolution"] == entry.int8.output_scale
    assert report["gap"] == verdict.gap and report["unresolved"] == {other: verdict.gap}
    assert report["int8"]["dtype"] == "int8" and report["table_differences"][flavour] == 0
    assert verdict.message().startswith("GELU flavour not distinguishable at int8: ")
    assert f"{flavour} and {other} differ by at most 0.00047" in verdict.message()
    # quick is 2e-2 from either: above one step, a change the site can show
    assert _verdict(QUICK, [entry]).status == CHANGED


def test_flipped_flag_under_one_step_is_indistinguishable(int8_tflite):
    """GeluOptions.approximate flipped on the int8 file: the table is tanh's (measured, not read from
    the flag), a difference under one output step from exact."""
    (entry,) = int8_tflite.inventory(mbt.set_gelu_flag(True)(int8_tflite(EXACT)), "flipped")
    assert (entry.measured, entry.table_differences[TANH]) == (TANH, 0)
    verdict = _verdict(EXACT, [entry])
    assert verdict.status == INDISTINGUISHABLE and not verdict.failed
    assert "holds the int8 table of tanh (exact's differs in" in verdict.message()


def test_fine_output_scale_tells_exact_from_tanh(int8_tflite):
    """Bias -4 puts the GELU on its negative branch, whose outputs are tiny: an output step of ~4e-4,
    under the 4.7e-4 exact-tanh gap. There the exact table is kept, and the flipped flag is a change."""
    content = int8_tflite(EXACT, bias=-4.0)
    (entry,) = int8_tflite.inventory(content, "fine")
    assert entry.int8.output_scale < EXACT_TANH_GAP and entry.table_differences[TANH] > 16
    assert _verdict(EXACT, [entry]).status == KEPT
    (flipped,) = int8_tflite.inventory(mbt.set_gelu_flag(True)(content), "fine_flipped")
    assert flipped.measured == TANH
    verdict = _verdict(EXACT, [flipped])
    assert verdict.status == CHANGED and verdict.failed
    assert "int8 output step" in verdict.message() and "exact's table differs in" in verdict.message()


@pytest.mark.parametrize("how", ["keras_relu", "gelu_op_pointed_at_relu"])
def test_relu_in_place_of_gelu_is_changed(int8_tflite, how):
    content = int8_tflite(RELU) if how == "keras_relu" else mbt.gelu_to_relu()(int8_tflite(EXACT))
    entries = int8_tflite.inventory(content, how)
    assert [e.flavour for e in entries] == [RELU]
    verdict = _verdict(EXACT, entries)
    assert verdict.status == CHANGED and verdict.failed


# ---- ONNX QDQ --------------------------------------------------------------------------------------


def _mlp(activation: str) -> onnx.ModelProto:
    """MatMul -> Gelu-20 (or the erf decomposition, opset 17) -> MatMul, seeded weights."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.5, name)
             for name, shape in (("w1", (8, 16)), ("w2", (16, 8)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="up")]
    if activation == "gelu20":
        nodes.append(helper.make_node("Gelu", ["h"], ["a"], name="gelu"))
    else:
        nodes += [helper.make_node("Div", ["h", "sqrt2"], ["d"], name="div"),
                  helper.make_node("Erf", ["d"], ["e"], name="erf"),
                  helper.make_node("Add", ["e", "one"], ["p"], name="add"),
                  helper.make_node("Mul", ["h", "p"], ["m"], name="mul"),
                  helper.make_node("Mul", ["m", "half"], ["a"], name="mul_half")]
        inits += [numpy_helper.from_array(np.array(v, np.float32), n)
                  for n, v in (("sqrt2", math.sqrt(2)), ("one", 1.0), ("half", 0.5))]
    nodes.append(helper.make_node("MatMul", ["a", "w2"], ["y"], name="down"))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20 if activation == "gelu20" else 17)],
                             ir_version=10)


def _quantized(model: onnx.ModelProto, folder) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Batches(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.batches = iter([{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    source, out = folder / "float.onnx", folder / "qdq.onnx"
    onnx.save(model, source)
    quantize_static(str(source), str(out), Batches(), quant_format=QuantFormat.QDQ)
    return onnx.load(out)


@pytest.mark.parametrize("activation, op", [("gelu20", "Gelu"), ("erf_chain", "erf-chain")])
def test_onnx_qdq_gelu_is_measured_in_float_with_its_resolution(tmp_path, activation, op):
    """quantize_static (QDQ) leaves Gelu in float between DequantizeLinear and QuantizeLinear, and
    interleaves the erf chain's Add/Mul with requantizations: both still measure exact, and carry the
    QuantizeLinear's scale. A source tanh there is under one step: indistinguishable; quick is a change."""
    model = _quantized(_mlp(activation), tmp_path)
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in model.graph.node}
    (entry,) = onnx_inventory(model)
    assert (entry.site.op, entry.flavour, entry.confident) == (op, EXACT, True)
    assert entry.table_differences == {}
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "a")
    scale = next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == q.input[1])
    assert entry.int8.output_scale == pytest.approx(float(scale)) and entry.int8.input_scale is not None
    kept = _verdict(EXACT, [entry])
    assert kept.status == KEPT and kept.to_dict()["resolution"] == entry.int8.output_scale
    swapped = _verdict(TANH, [entry])
    assert swapped.status == INDISTINGUISHABLE and not swapped.failed and list(swapped.unresolved) == [EXACT]
    assert "computes exact in float, rounded to int8 after" in swapped.message()
    assert _verdict(QUICK, [entry]).status == CHANGED
