"""The GELU corpus: third-party models and other tools' artifacts (see test_gelu_corpus.py).

keras-hub installs into a cached folder put on sys.path, without its declared tensorflow-text
(which would pull full TensorFlow next to tensorflow-cpu; the backbones do not use it). onnx2tf
runs in a cached Python 3.12 venv (tests/compat/runtime_venvs.py).
"""

import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))

from runtime_venvs import ONNX2TF, Unavailable, cache_dir, runtime_venv  # noqa: E402

KERAS_HUB = "keras-hub==0.32.0"


@pytest.fixture(scope="session")
def keras_hub_path():
    """A folder holding keras-hub (no dependencies), on sys.path for this session."""
    target = cache_dir() / KERAS_HUB.replace("==", "-")
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target / "keras_hub").is_dir():
            result = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "--no-input",
                 "--progress-bar", "off", "--target", str(target), KERAS_HUB],
                capture_output=True, text=True, timeout=600)
            if result.returncode != 0:
                pytest.fail(f"pip install {KERAS_HUB} failed: {result.stderr.strip().splitlines()[-1:]}")
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    return target


@pytest.fixture(scope="session")
def onnx2tf():
    """A function converting an ONNX file to float32 TFLite with onnx2tf; returns the .tflite path."""
    try:
        venv = runtime_venv(ONNX2TF)
    except Unavailable as exc:
        pytest.skip(str(exc))

    def convert(onnx_path: Path, out_dir: Path, *flags: str) -> Path:
        # onnx2tf rewrites its input in place (op renaming): it gets a copy.
        out_dir.mkdir(parents=True, exist_ok=True)
        work = out_dir / "onnx2tf-input.onnx"
        work.write_bytes(Path(onnx_path).read_bytes())
        result = subprocess.run(
            [str(venv / "bin" / "onnx2tf"), "-i", str(work), "-o", str(out_dir), "-nuo", "-n", *flags],
            capture_output=True, text=True, timeout=600, env={"PATH": "/usr/bin:/bin", "TQDM_DISABLE": "1"})
        produced = out_dir / f"{work.stem}_float32.tflite"
        assert result.returncode == 0 and produced.is_file(), result.stdout[-2000:] + result.stderr[-2000:]
        return produced

    return convert
