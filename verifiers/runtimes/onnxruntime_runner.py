"""onnxruntime: onnx.checker (full check) on a file, then a CPU session with default options.

An in-memory model (the bytes of a variant built from an artifact already checked, such as the
GELU-swapped one) goes straight to a session, which reads its external data (the artifact's
weights, where they lie on disk) from `data_folder`.

A file that computes in float16 runs in two variants: `default`, the session as onnxruntime's CPU
provider runs it (its kernels compute most float16 ops in float32, so nothing overflows), and
`float16`, the same graph with float16 arithmetic emulated op by op
(verifiers.onnx_float16). `arithmetic` says what each computed in.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from verifiers import runtimes
from verifiers.errors import Incompatible, one_line
from verifiers.runtimes import InvalidArtifact, ProbeFailed, Runner, TensorInfo

_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}
# Where a session made from bytes reads the model's external data (onnxruntime_session_options_config_keys.h).
_EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"
_DISABLE_PREPACKING = "session.disable_prepacking"
# onnx.checker's refusal of nodes out of order, which onnxruntime sorts and runs.
_UNSORTED = "Nodes in a graph must be topologically sorted"
# What each variant computes a float16 model's values in (Runner.arithmetic).
FLOAT32_KERNELS = ("float32: onnxruntime's CPU kernels compute float16 ops in float32 (x86 has no float16 "
                   "kernels for most ops), so intermediate values never overflow")
FLOAT16_EMULATED = "float16: every float16 value rounded to float16 where an op makes it, overflowing to Inf"
# Load errors that mean "this runtime is too old for the artifact", not "the artifact is broken".
_RUNTIME_TOO_OLD = ("opset", "ir version", "ir_version", "not implemented", "unsupported")


class OnnxRuntimeRunner(Runner):
    runtime = "onnxruntime"
    formats = ("onnx",)
    imports = ("onnxruntime", "onnx", "verifiers.onnx_model")

    def __init__(self, model: Path | bytes, data_folder: Path | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = runtimes.run_threads
        if isinstance(model, (bytes, bytearray)):
            self.path, source = Path("<in-memory model>"), bytes(model)
            if data_folder is not None:
                options.add_session_config_entry(_EXTERNAL_DATA_FOLDER, str(data_folder))
                # A variant runs a batch or two: packing its weights for the matmul kernels would copy
                # them and cost more than it saves (data files stay memory-mapped without it); nor does
                # it need graph rewrites, whose constant folding fails on an artifact onnxruntime's own
                # transformer optimizer wrote once its weights lie outside the model ("Attempt to
                # replace the existing tensor").
                options.add_session_config_entry(_DISABLE_PREPACKING, "1")
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        else:
            self.path = source = Path(model)
            structure, self.notes = checked_structure(self.path)
        try:
            self.session = ort.InferenceSession(source if isinstance(source, bytes) else str(source), options,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:
            message = one_line(exc)
            if any(marker in message.lower() for marker in _RUNTIME_TOO_OLD):
                raise Incompatible(
                    f"onnxruntime {_version()} cannot load {self.path.name}: {message}"
                ) from exc
            raise InvalidArtifact(f"{self.path}: onnxruntime cannot load it: {message}") from exc
        self.inputs = [_info(i) for i in self.session.get_inputs()]
        self.outputs = [_info(o) for o in self.session.get_outputs()]
        self.sessions = {"default": self.session}
        if not isinstance(source, bytes):
            self._emulate_float16(structure, options)

    def _emulate_float16(self, structure, options) -> None:
        """A second session with float16 arithmetic emulated, for a file that computes in float16
        (see the module's docstring; `structure`: the file's graph, its weights where they lie);
        where it cannot be made, `arithmetic` says why."""
        from verifiers.onnx_float16 import computes_in_float16

        if not computes_in_float16(structure):
            return
        self.arithmetic = {"default": FLOAT32_KERNELS}
        session, self.arithmetic["float16"] = float16_emulation(structure, self.path.parent,
                                                                options.intra_op_num_threads)
        if session is not None:
            self.sessions["float16"] = session
            self.variants = ("default", "float16")

    def profile(self, feed: dict[str, np.ndarray], runs: int) -> dict[tuple[str, str], float]:
        """onnxruntime's profiler (SessionOptions.enable_profiling) on a session made as the default
        one: each node's kernel time per run, by (node name, op type) as the optimized graph has
        them (the first, warm-up run not counted)."""
        import json
        import tempfile

        import onnxruntime as ort

        if self.path.name == "<in-memory model>":
            return {}
        options = ort.SessionOptions()
        options.intra_op_num_threads = runtimes.run_threads
        options.enable_profiling = True
        with tempfile.TemporaryDirectory(prefix="exportgate-profile-") as folder:
            options.profile_file_prefix = str(Path(folder) / "profile")
            session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
            named = {info.name: feed[info.name] for info in self.inputs}
            for _ in range(runs + 1):
                session.run(None, named)
            events = json.loads(Path(session.end_profiling()).read_text())
        runs_at = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
        counted = runs_at[1] if len(runs_at) > 1 else 0  # the warm-up run's events end before the second run starts
        per_node: dict[tuple[str, str], float] = {}
        for event in events:
            if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time") and event["ts"] >= counted:
                key = (event["name"][:-len("_kernel_time")], event.get("args", {}).get("op_name", "?"))
                per_node[key] = per_node.get(key, 0.0) + event["dur"] / 1000 / runs
        return per_node

    @classmethod
    def probe(cls, model: bytes, variant: str | None = None) -> OnnxRuntimeRunner:
        """A session without graph optimizations (so the probe's nodes run as the artifact wrote
        them), on one thread."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        runner = cls.__new__(cls)
        runner.path = Path("<probe>")
        runner.session = ort.InferenceSession(bytes(model), options, providers=["CPUExecutionProvider"])
        runner.inputs = [_info(i) for i in runner.session.get_inputs()]
        runner.outputs = [_info(o) for o in runner.session.get_outputs()]
        return runner

    @classmethod
    def run_probe(cls, model: bytes, x: np.ndarray, variant: str | None = None) -> np.ndarray:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        try:
            return super().run_probe(model, x, variant)
        except (state.Fail, state.NotImplemented, state.InvalidGraph, state.InvalidArgument,
                state.RuntimeException) as exc:
            raise ProbeFailed(str(exc).splitlines()[0]) from exc

    @classmethod
    def run_inspection(cls, model, feed, keep, data_folder=None):
        """A session without graph optimizations (every kept tensor is computed by the nodes that
        name it), reading the artifact's weights from `data_folder` without packing copies."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        options.add_session_config_entry(_DISABLE_PREPACKING, "1")
        if data_folder is not None:
            options.add_session_config_entry(_EXTERNAL_DATA_FOLDER, str(data_folder))
        session = ort.InferenceSession(bytes(model), options, providers=["CPUExecutionProvider"])
        results = session.run(list(keep), {i.name: feed[i.name] for i in session.get_inputs()})
        return dict(zip(keep, results))

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feed)

    def run_all(self, feed: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
        return self.run_each({variant: feed for variant in self.sessions})

    def run_each(self, feeds: dict[str, dict[str, np.ndarray]]) -> dict[str, list[np.ndarray]]:
        return {variant: self.run(feed) if variant == "default" else self.sessions[variant].run(None, feed)
                for variant, feed in feeds.items()}


def checked_structure(path: Path, runtime: str = "onnxruntime"):
    """onnx.checker's full check of a file, and its structure (its graph, read without its
    weights) with the notes the check leaves: a graph out of topological order is verified as
    runtimes run it (they sort it themselves), the checker's whole message a note."""
    import onnx

    from verifiers.onnx_model import load_structure

    structure = load_structure(path).model  # refuses external data outside the model's folder before any read
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        if _UNSORTED not in message:
            raise InvalidArtifact(f"{path}: fails onnx.checker: {type(exc).__name__}: {message}") from exc
        return structure, [f"onnx.checker refuses the file, and {runtime} loads it: {message}"]
    return structure, []


def float16_emulation(structure, folder: Path, threads: int):
    """(session, what it computes in): an onnxruntime session of `structure` (a file's graph whose
    weights lie in `folder`) with float16 arithmetic emulated op by op (verifiers.onnx_float16), or
    (None, why it could not be made)."""
    import onnxruntime as ort

    from verifiers.onnx_float16 import NotEmulated, emulated

    try:
        model = emulated(structure)
    except NotEmulated as exc:
        return None, f"not run: the emulation cannot rewrite it: {exc}"
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no cast pair folded
    options.add_session_config_entry(_EXTERNAL_DATA_FOLDER, str(folder))
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - the rewrite onnxruntime refuses: said, and the run is not green
        return None, f"not run: onnxruntime refuses the emulation: {one_line(exc)}"
    return session, FLOAT16_EMULATED


def _info(arg) -> TensorInfo:
    return TensorInfo(arg.name, list(arg.shape), _ORT_TYPES.get(arg.type, arg.type))


def _version() -> str:
    from importlib import metadata

    return metadata.version("onnxruntime")
