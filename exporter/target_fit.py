"""Fit an exported ONNX file to what its target runtime loads, beyond opsets: the IR version.

onnx 1.23 stamps IR version 10 or 11 on every model it saves; onnxruntime 1.16 loads at most 9
("Unsupported model IR version: 10, max supported IR version: 9"). The IR version an opset set
needs is usually lower, so the stamp can come down without changing the graph.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from verifiers.onnx_model import load_structure
from verifiers.targets import Target


def fit_ir_version(path: Path, target: Target) -> str | None:
    """Lower the file's IR version to the target's when its opsets allow; a note when it did."""
    if target.max_ir_version is None:  # only ONNX targets have one
        return None
    structure = load_structure(path).model
    if structure.ir_version <= target.max_ir_version:
        return None
    needed = onnx.helper.find_min_ir_version_for(list(structure.opset_import), ignore_unknown=True)
    if needed > target.max_ir_version:
        return None  # the target check reports it
    model = onnx.load(str(path), load_external_data=False)
    stamped = model.ir_version
    model.ir_version = target.max_ir_version
    onnx.save(model, str(path))
    return f"IR version {stamped} lowered to {target.max_ir_version} for {target.name} (its opsets need {needed})"
