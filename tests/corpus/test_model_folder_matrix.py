"""Every model folder of fixtures/models/hf_folders.py, exported for its inferred task to ONNX at
opsets 17 and 20 and to TFLite, and verified at several sizes of each dynamic axis (README
"transformers model folders": the table of cells). Slow: 45 exports.
"""

import pytest

from exporter import api
from fixtures.models.hf_folders import FOLDERS, save_folder

pytestmark = pytest.mark.slow

CELLS = [("onnx", 17), ("onnx", 20), ("tflite", None)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    return {name: save_folder(name, root / name) for name in FOLDERS}


@pytest.mark.parametrize("to, opset", CELLS, ids=["onnx17", "onnx20", "tflite"])
@pytest.mark.parametrize("name", FOLDERS)
def test_each_folder_exports_and_verifies(saved, tmp_path, name, to, opset):
    out = tmp_path / f"{name}.{to}"
    report = api.export(str(saved[name]), to=to, out=out, opset=opset)
    assert report.exit_code == 0, report.summary_lines()
    assert (report.model_type, report.task) == (FOLDERS[name].model_type, FOLDERS[name].task)
    assert out.is_file()
    if to == "onnx":  # every task axis held at its export size and three others
        symbols = {entry["symbol"] for entry in report.dynamic}
        assert "batch_size" in symbols
        assert all(entry["status"] == "pass" and len(entry["sizes"]) >= 3 for entry in report.dynamic)
    else:  # litert-torch exports at the example's sizes
        assert any("static shapes only" in note for note in report.notes)
