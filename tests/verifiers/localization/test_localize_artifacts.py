"""Localisation on third-party models exported by exportgate's routes, faults injected into the
artifacts (fixtures/inject_faults.py): the first divergence is the faulted op, in the module and at
the source line the exporters themselves record for it, and a faithful export has none. A few
fault kinds per route here, each with an expected module (and, for PyTorch, line) that the oracle
reads by another route than localisation does (fixtures/localization_corpus.py); every kind on
every model is the slow corpus (tests/corpus/test_localization_corpus.py)."""

import pytest

from fixtures.localization_corpus import run_cell

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

def cell(model: str, route: str, kinds: tuple[str, ...], *marks):
    return pytest.param(model, route, kinds, id=f"{model}-{route}", marks=marks)


CELLS = [
    cell("bert", "onnx-dynamo", ("weight_perturbed", "bias_zeroed", "softmax_axis", "where_inverted", "add_to_sub")),
    # BERT's TFLite cell is the slow suite's: the CNN cell localises on the same route by default.
    cell("bert", "tflite", ("weight_perturbed", "bias_zeroed", "transpose_perm", "layernorm_epsilon"), pytest.mark.slow),
    cell("cnn", "tflite", ("weight_perturbed", "activation_swapped")),
    cell("transformer_block", "onnx-tf2onnx", ("bias_zeroed", "transpose_perm", "mul_constant")),
    cell("transformer_block", "tflite", ("layernorm_gamma", "softmax_axis", "attention_scale")),
]


@pytest.mark.parametrize(("model", "route", "kinds"), CELLS)
def test_faults_are_found_where_the_exporter_put_them(tmp_path, model, route, kinds):
    cell = run_cell(model, route, tmp_path, kinds)

    assert not cell.clean_first and cell.clean.startswith("no divergence"), cell.clean
    assert [case.kind for case in cell.cases] == list(kinds), cell.absent
    torch = model in ("bert", "cnn")
    for case in cell.cases:  # every case has an expectation to meet (the oracle always knows one here)
        assert case.first, (case.kind, case.fault, case.message)
        assert case.module is True, (case.kind, case.found, case.expected)
        assert case.source is (True if torch else None), (case.kind, case.found, case.expected)
