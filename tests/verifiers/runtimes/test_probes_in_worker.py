"""GELU probes run in a runtime worker while the caller reads the artifact; a spare worker, started
before the runtime is known, is taken by the first runtime that needs one under the same limits."""

import onnx
from onnx import TensorProto, helper

from verifiers.gelu import EXACT
from verifiers.formats.onnx.gelu_sites import find_gelu_sites
from verifiers.formats.onnx.gelu_fingerprint import fingerprint_sites
from verifiers.runtimes import runtime_for
from verifiers.runtimes import isolation


def _gelu_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_probes_run_in_the_spare_worker_and_measure_what_the_runtime_computes():
    isolation.start_spare()
    [spare] = isolation._SPARE
    model = _gelu_model()
    with isolation.ProbesInWorker(runtime_for("onnx")) as probes:
        assert probes._worker is spare and isolation._SPARE == [] and spare.runtime == "onnxruntime"
        [fp] = fingerprint_sites(model, find_gelu_sites(model), probes)
    assert (fp.measured, fp.classification.confident) == (EXACT, True)


def test_a_spare_under_other_limits_is_not_taken():
    isolation.start_spare()
    [spare] = isolation._SPARE
    with isolation.limits(memory_limit=3), isolation.ProbesInWorker(runtime_for("onnx")) as probes:
        assert probes._worker is not spare
    assert isolation._SPARE == [] and not spare.alive()


def test_without_a_worker_started_ahead_none_starts_until_a_probe_runs():
    """An artifact without GELU sites starts no runtime worker; the first probe starts one."""
    model = _gelu_model()
    assert not isolation._SPARE and "onnxruntime" not in isolation._EARLY
    with isolation.ProbesInWorker(runtime_for("onnx")) as probes:
        assert fingerprint_sites(model, [], probes) == [] and probes._worker is None
        [fp] = fingerprint_sites(model, find_gelu_sites(model), probes)
        assert probes._worker is not None and probes._worker.alive()
    assert fp.measured == EXACT
