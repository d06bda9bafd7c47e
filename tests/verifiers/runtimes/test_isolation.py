"""Runtimes run artifacts in a worker process: a crash, a hang or running out of memory is a
finding that names the runtime, the signal and the step, within the time limit."""

import time

import numpy as np
import pytest

from verifiers.errors import BadInput
from fixtures import runners
from verifiers.runtimes import isolation
from verifiers.runtimes.isolation import IsolatedRunner, RuntimeCrashed


def test_a_runner_in_a_worker_runs_like_itself(tmp_path):
    runner = IsolatedRunner(runners.EchoRunner, tmp_path / "m.onnx")
    assert [i.name for i in runner.inputs] == ["x"] and runner.variants == ("default",)
    np.testing.assert_array_equal(runner.run({"x": np.arange(3.0)})[0], [0.0, 2.0, 4.0])
    runner.close()


@pytest.mark.parametrize(("runner_class", "step"), [(runners.AbortingRunner, "running the artifact"),
                                                     (runners.AbortingLoader, "loading m.onnx")])
def test_an_abort_is_a_finding_naming_runtime_signal_and_step(tmp_path, runner_class, step):
    with pytest.raises(RuntimeCrashed) as caught:
        runner = IsolatedRunner(runner_class, tmp_path / "m.onnx")
        runner.run({"x": np.zeros(1, np.float32)})
    assert str(caught.value) == f"aborting-runtime crashed (SIGABRT) while {step}"
    assert caught.value.kind == "runtime"


def test_a_worker_started_early_is_the_next_runners_and_is_closed_when_none_takes_it(tmp_path):
    close_if_unused = isolation.start_early(runners.EchoRunner)
    early = isolation._EARLY["echo-runtime"]
    runner = IsolatedRunner(runners.EchoRunner, tmp_path / "m.onnx")
    assert runner._worker is early and early.alive()
    close_if_unused()
    assert early.alive()  # a runner took it: it stays the runner's
    runner.close()

    close_if_unused = isolation.start_early(runners.EchoRunner)
    unused = isolation._EARLY["echo-runtime"]
    close_if_unused()
    assert not unused.alive() and "echo-runtime" not in isolation._EARLY


def test_a_load_sent_ahead_raises_its_error_where_the_runner_is_first_used(tmp_path):
    runner = IsolatedRunner(runners.AbortingLoader, tmp_path / "m.onnx", wait=False)
    with pytest.raises(RuntimeCrashed, match=r"crashed \(SIGABRT\) while loading m.onnx"):
        runner.inputs
    with pytest.raises(RuntimeCrashed, match="while loading m.onnx"):
        runner.wait_loaded()


def test_a_segfault_in_a_call_is_a_finding():
    with pytest.raises(RuntimeCrashed, match=r"^probe-runtime crashed \(SIGSEGV\) while probing$"):
        isolation.call(runners.segfault, runtime="probe-runtime", step="probing")


def test_a_hang_ends_at_the_time_limit(tmp_path):
    """The worker starts and loads under the default limit (its start-up takes what it takes); only
    the run, which hangs for an hour, gets two seconds. The wait ends at the limit, the hang still
    going: the worker had to be killed, it never finished nor obeyed "close"."""
    runner = IsolatedRunner(runners.HangingRunner, tmp_path / "m.onnx")
    start = time.monotonic()
    with isolation.limits(timeout=2), pytest.raises(RuntimeCrashed) as caught:
        runner.run({"x": np.zeros(1, np.float32)})
    print(f"the hang ended after {time.monotonic() - start:.1f} s")  # measured, not asserted
    assert str(caught.value) == "hanging-runtime did not finish running the artifact within 2 s (--timeout)"
    assert caught.value.kind == "runtime"
    assert not runner._worker.alive() and runner._worker.process.returncode < 0  # killed mid-hang


def test_memory_past_the_limit_is_a_finding():
    with isolation.limits(memory_limit=1), pytest.raises(RuntimeCrashed, match="out of memory"):
        isolation.call(runners.allocate, 2 << 30, runtime="probe-runtime", step="probing")
    assert isolation.call(runners.allocate, 1 << 20, runtime="probe-runtime", step="probing") == 1 << 20


def test_the_runs_thread_count_reaches_the_runtime_in_the_worker(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    for threads in (1, 3):
        with isolation.limits(threads=threads):
            assert isolation.call(runners.session_threads, path, runtime="onnxruntime", step="loading") == threads
    assert isolation.call(runners.session_threads, path, runtime="onnxruntime", step="loading") == 0


def test_the_steps_own_errors_come_back_as_they_were(tmp_path):
    from verifiers.runtimes import open_runner

    with pytest.raises(BadInput, match="no such file"):
        open_runner("onnx", tmp_path / "missing.onnx")


def test_a_script_without_a_main_guard_runs_once(tmp_path):
    # The worker is not multiprocessing's spawn, which would run the script again inside it.
    import sys

    from fixtures.children import run_child
    from fixtures.specs import torch_model

    script = tmp_path / "script.py"
    script.write_text("import pathlib\nfrom exporter import api\n"
                      f"with open({str(tmp_path / 'runs')!r}, 'a') as f: f.write('run\\n')\n"
                      f"r = api.export({torch_model('mlp_exact')!r}, to='onnx', opset=17, out={str(tmp_path / 'm.onnx')!r})\n"
                      "print(r.exit_code)\n")
    result = run_child([sys.executable, script], cwd=tmp_path, timeout=300)
    assert result.stdout.strip() == "0", result.stderr
    assert (tmp_path / "runs").read_text() == "run\n"
