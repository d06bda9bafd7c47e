"""The GELU corpus: third-party models and other tools' artifacts (see test_gelu_corpus.py).

keras-hub installs into a cached folder put on sys.path (`fixtures.zoo.ensure_keras_hub`); onnx2tf
runs in a cached Python 3.12 venv (tests/compat/runtime_venvs.py).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))

from runtime_venvs import ONNX2TF, Unavailable, runtime_venv  # noqa: E402

from fixtures import zoo  # noqa: E402
from fixtures.children import run_child  # noqa: E402
from tests.conftest import tool_missing  # noqa: E402


@pytest.fixture(scope="session")
def keras_hub_path():
    """A folder holding keras-hub (no dependencies), on sys.path for this session."""
    return zoo.ensure_keras_hub()


@pytest.fixture(scope="session")
def onnx2tf():
    """A function converting an ONNX file to float32 TFLite with onnx2tf; returns the .tflite path."""
    try:
        venv = runtime_venv(ONNX2TF)
    except Unavailable as exc:
        tool_missing(str(exc))

    def convert(onnx_path: Path, out_dir: Path, *flags: str) -> Path:
        # onnx2tf rewrites its input in place (op renaming): it gets a copy.
        out_dir.mkdir(parents=True, exist_ok=True)
        work = out_dir / "onnx2tf-input.onnx"
        work.write_bytes(Path(onnx_path).read_bytes())
        result = run_child([venv / "bin" / "onnx2tf", "-i", work, "-o", out_dir, "-nuo", "-n", *flags],
                           timeout=600, env={"PATH": "/usr/bin:/bin", "TQDM_DISABLE": "1"})
        produced = out_dir / f"{work.stem}_float32.tflite"
        assert result.returncode == 0 and produced.is_file(), result.stdout[-2000:] + result.stderr[-2000:]
        return produced

    return convert
