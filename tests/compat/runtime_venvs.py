"""Venvs holding old runtimes (onnxruntime 1.16/1.17, tflite-runtime 2.7/2.8), built once and
cached, and a runner that loads a model in one of them and runs it on given inputs.

Cache: $EXPORTGATE_COMPAT_CACHE, or <repo>/.cache/compat (git-ignored). One folder per runtime,
named by the runtime and a hash of the interpreter's version and the requirements; a file lock
keeps pytest-xdist workers from building the same venv twice, and a marker file written last
tells a finished venv from a half-built one.

Each venv gets only the runtime wheel and numpy (`pip install --no-deps`): a model can be loaded
and run with no more, and this keeps a cold cache to about 25 MB of downloads per venv instead of
the 60+ MB that onnxruntime's full dependency set (sympy, protobuf, ...) costs.

This file is also the script run inside those venvs (`python -I runtime_venvs.py run ...`), so
its top level imports the standard library only and its child part needs only numpy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
READY = ".exportgate-ready"
# pip output that means the index has no distribution of the package for this interpreter and
# platform: it cannot be installed here.
UNAVAILABLE_PATTERNS = (
    "No matching distribution found",
    "Could not find a version that satisfies",
)
# pip output that means it did not reach the index: pip then also says it found no distribution,
# but that says nothing about this machine, and the venv is simply not built yet.
NETWORK_PATTERNS = (
    "Max retries exceeded",
    "NewConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "SSLError",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Connection refused",
)


class Unavailable(Exception):
    """The interpreter, or a distribution of a package for it, does not exist on this machine: the
    test skips. A network error is not that: it fails (see _pip_install)."""


@dataclass(frozen=True)
class RuntimeSpec:
    name: str  # folder name prefix, e.g. "onnxruntime-1.16.3"
    interpreter: str  # command, looked up on PATH
    requirements: tuple[str, ...]  # pip requirement specifiers, installed with --no-deps
    env: dict[str, str] = field(default_factory=dict)  # e.g. {"PYENV_VERSION": "3.9.18"}
    kind: str = "onnx"  # "onnx" (onnxruntime), "tflite" (tflite_runtime), or "tool" (a converter)
    check_module: str = ""  # what must import in the venv (default: the runtime's module)

    def describe(self) -> str:
        prefix = " ".join(f"{k}={v}" for k, v in self.env.items())
        return f"{prefix + ' ' if prefix else ''}{self.interpreter} + {' '.join(self.requirements)}"


ORT_1_16 = RuntimeSpec("onnxruntime-1.16.3", "python3.11", ("onnxruntime==1.16.3", "numpy<2"))
ORT_1_17 = RuntimeSpec("onnxruntime-1.17.3", "python3.11", ("onnxruntime==1.17.3", "numpy<2"))
# tflite-runtime has no wheel for Python 3.11 before 2.14: these need a 3.9 (pyenv here).
TFLITE_2_7 = RuntimeSpec("tflite-runtime-2.7.0", "python3.9", ("tflite-runtime==2.7.0", "numpy<2"),
                         {"PYENV_VERSION": "3.9.18"}, kind="tflite")
TFLITE_2_8 = RuntimeSpec("tflite-runtime-2.8.0", "python3.9", ("tflite-runtime==2.8.0", "numpy<2"),
                         {"PYENV_VERSION": "3.9.18"}, kind="tflite")
# onnx2tf, the ONNX -> TFLite converter users reach for (Python >= 3.12). Its default backend writes
# the flatbuffer itself and needs no TensorFlow; with --no-deps these are all a conversion imports
# (its declared pins would downgrade numpy and onnx).
ONNX2TF = RuntimeSpec(
    "onnx2tf-2.6.9", "python3.12",
    ("onnx2tf==2.6.9", "numpy==2.4.6", "onnx==1.23.2", "protobuf==7.36.2", "ml_dtypes==0.7.0",
     "typing_extensions==4.16.0", "psutil==7.2.2", "sng4onnx==2.0.1", "ai-edge-litert==2.3.0",
     "backports.strenum==1.2.8", "flatbuffers==25.12.19", "tqdm==4.70.1"),
    {"PYENV_VERSION": "3.12.1"}, kind="tool", check_module="onnx2tf")


def cache_dir() -> Path:
    return Path(os.environ.get("EXPORTGATE_COMPAT_CACHE") or REPO / ".cache" / "compat")


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _base_interpreter(spec: RuntimeSpec) -> tuple[str, str]:
    """(real executable, 'Python X.Y.Z') of the spec's interpreter, or Unavailable."""
    command = shutil.which(spec.interpreter)
    if command is None:
        raise Unavailable(f"{spec.interpreter} is not on PATH (needed for {spec.describe()})")
    probe = _run([command, "-c", "import sys, platform; print(sys.executable); print(platform.python_version())"],
                 env=dict(spec.env), timeout=60)
    if probe.returncode != 0:
        raise Unavailable(f"{spec.describe()}: interpreter does not start: {_one_line(probe.stderr)}")
    executable, version = probe.stdout.split()[:2]
    return executable, version


def _run(command: list, timeout: float, env: dict | None = None):
    """A child of the test process (fixtures.children, imported here: this file's top level runs
    inside the old runtimes' venvs too)."""
    from fixtures.children import run_child

    return run_child(command, timeout=timeout, env=env)


def _pip_install(python: str, requirements: tuple[str, ...], log: Path) -> None:
    # The pip of the interpreter running pytest installs into the target venv (--python, pip >= 22.3):
    # the venv needs no pip of its own, which saves the ensurepip step.
    cmd = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--disable-pip-version-check",
           "--no-input", "--progress-bar", "off", *requirements]
    result = _run(cmd, timeout=900)
    log.write_text(f"$ {' '.join(cmd)}\n{result.stdout}\n{result.stderr}", encoding="utf-8")
    if result.returncode != 0:
        text = result.stdout + result.stderr
        network = [line for line in text.splitlines() if any(p in line for p in NETWORK_PATTERNS)]
        if network:
            raise RuntimeError(f"pip install {' '.join(requirements)} could not reach the package index (the venv "
                               f"is built once, then cached); see {log}: {_one_line(network[-1])}")
        if any(p in text for p in UNAVAILABLE_PATTERNS):
            errors = [line for line in text.splitlines() if line.startswith("ERROR")]
            raise Unavailable(_one_line(" ".join(errors) or text))
        raise RuntimeError(f"pip install {' '.join(requirements)} failed; see {log}: {_one_line(result.stderr)}")


def _lock(path: Path):
    import fcntl

    handle = open(path, "w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def runtime_venv(spec: RuntimeSpec) -> Path:
    """The venv for `spec` (its folder), built on first use. Raises Unavailable."""
    executable, version = _base_interpreter(spec)
    key = hashlib.sha256(json.dumps([version, spec.requirements]).encode()).hexdigest()[:10]
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"{spec.name}-py{version}-{key}"
    with _lock(root / f"{venv.name}.lock"):
        if (venv / READY).is_file():
            return venv
        shutil.rmtree(venv, ignore_errors=True)  # a half-built one from an interrupted run
        start = time.perf_counter()
        made = _run([executable, "-m", "venv", "--without-pip", str(venv)], timeout=300)
        if made.returncode != 0:
            raise Unavailable(f"{spec.describe()}: cannot create a venv: {_one_line(made.stderr)}")
        python = str(venv / "bin" / "python")
        try:
            _pip_install(python, spec.requirements, root / f"{venv.name}.pip.log")
            module = spec.check_module or RUNTIME_KINDS[spec.kind][0]
            check = _run([python, "-I", "-c", f"import {module}"], timeout=120)
            if check.returncode != 0:
                raise RuntimeError(f"{spec.describe()}: import {module} fails: {_one_line(check.stderr)}")
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        seconds = time.perf_counter() - start
        (venv / READY).write_text(json.dumps({"spec": spec.describe(), "seconds": round(seconds, 1)}) + "\n")
        return venv


# ---- running a model in a venv --------------------------------------------------------------------


@dataclass
class RunResult:
    ok: bool
    stage: str  # "load" or "run" when not ok; "done" when ok
    error: str  # one line, "" when ok
    outputs: list  # numpy arrays, in the model's output order
    version: str  # the runtime's __version__
    stderr: str = ""  # what the runtime printed (TF Lite logs its own reason there), one line

    def __str__(self) -> str:
        return f"{self.version}: ok" if self.ok else f"{self.version}: {self.stage} failed: {self.error}"


def run_model(venv: Path, kind: str, model: Path, inputs: list, save_graph: Path | None = None,
              timeout: float = 300) -> RunResult:
    """Load `model` with the venv's runtime (kind "onnx" or "tflite") and run it on `inputs`
    (numpy arrays, in the model's input order), in a subprocess. For onnx, `save_graph` names a
    file to receive the graph as the runtime loaded it (function ops inlined, no optimizations)."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="compat-run-") as tmp:
        work = Path(tmp)
        names = []
        for i, array in enumerate(inputs):
            path = work / f"in{i}.npy"
            np.save(path, np.asarray(array))
            names.append(str(path))
        # (the child's environment holds no ALLOW_RELEASED_ONNX_OPSET_ONLY, which set to 0 would make
        # onnxruntime load opsets it calls unreleased; -I keeps PYTHONPATH out)
        env = {"EXPORTGATE_SAVE_GRAPH": str(save_graph)} if save_graph is not None else {}
        proc = _run([str(venv / "bin" / "python"), "-I", str(Path(__file__).resolve()), "run", kind, str(model),
                     str(work), *names], timeout=timeout, env=env)
        report_path = work / "report.json"
        if not report_path.is_file():
            raise RuntimeError(f"runner crashed (exit {proc.returncode}): {_one_line(proc.stderr, 2000)}")
        report = json.loads(report_path.read_text(encoding="utf-8"))
        outputs = [np.load(work / f"out{i}.npy") for i in range(report["n_outputs"])]
        return RunResult(report["ok"], report["stage"], report["error"], outputs, report["version"],
                         _one_line(proc.stderr, 2000))


def _run_onnxruntime(model: str, arrays: list, report: dict) -> list:
    import onnxruntime as ort

    report["version"] = f"onnxruntime {ort.__version__}"
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    report["stage"] = "run"
    if os.environ.get("EXPORTGATE_SAVE_GRAPH"):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.optimized_model_filepath = os.environ["EXPORTGATE_SAVE_GRAPH"]
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(session.get_inputs(), arrays)}
    return session.run(None, feeds)


def _run_tflite_runtime(model: str, arrays: list, report: dict) -> list:
    import tflite_runtime
    from tflite_runtime.interpreter import Interpreter

    report["version"] = f"tflite-runtime {tflite_runtime.__version__}"
    interpreter = Interpreter(model_path=model)
    details = interpreter.get_input_details()
    for detail, array in zip(details, arrays):  # a Keras batch dimension is saved as 1
        if tuple(detail["shape"]) != array.shape:
            interpreter.resize_tensor_input(detail["index"], list(array.shape))
    interpreter.allocate_tensors()
    report["stage"] = "run"
    for detail, array in zip(details, arrays):
        interpreter.set_tensor(detail["index"], array)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


# Runtime kind -> (the module a venv must import, how the child runs a model in it). This file runs
# inside the old runtimes' venvs, where exportgate is not installed.
RUNTIME_KINDS = {
    "onnx": ("onnxruntime", _run_onnxruntime),
    "tflite": ("tflite_runtime.interpreter", _run_tflite_runtime),
}


def _child(kind: str, model: str, work: str, inputs: list[str]) -> None:
    """Runs inside the runtime venv: writes out<i>.npy and report.json into `work`."""
    import numpy as np

    report = {"ok": False, "stage": "load", "error": "", "n_outputs": 0, "version": "?"}
    outputs = []
    try:
        arrays = [np.load(p) for p in inputs]
        outputs = RUNTIME_KINDS[kind][1](model, arrays, report)
        report.update(ok=True, stage="done")
    except Exception as exc:  # the runtime's refusal is the result
        report["error"] = _one_line(f"{type(exc).__name__}: {exc}", 2000)
    for i, out in enumerate(outputs):
        np.save(os.path.join(work, f"out{i}.npy"), out)
    report["n_outputs"] = len(outputs)
    with open(os.path.join(work, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f)


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "run":
        _child(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    else:
        sys.exit("usage: runtime_venvs.py run onnx|tflite MODEL WORKDIR [INPUT.npy ...]")
