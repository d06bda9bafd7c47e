"""Could the output tolerance have seen a GELU flavour change? Swap exact and tanh at every site
of the artifact, run the variant, and see whether its outputs would still have passed."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from .catalogue import EXACT, TANH, SiteFlavour
from .onnx_writer import replace_site

SWAPPED = {EXACT: TANH, TANH: EXACT}


def swapped_variant(model: onnx.ModelProto, entries: list[SiteFlavour]) -> onnx.ModelProto | None:
    """The model with every exact GELU written as tanh and every tanh as exact; None when it has none."""
    swappable = [e for e in entries if e.flavour in SWAPPED]
    if not swappable:
        return None
    for entry in swappable:
        model = replace_site(model, entry.site, SWAPPED[entry.flavour])
    return model


def run_variant(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [session.run(None, feed) for feed in feeds]
