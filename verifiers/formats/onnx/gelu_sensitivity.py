"""Could the output tolerance have seen a GELU flavour change? The artifact with exact and tanh
swapped at every site, for the runtimes to run: would its outputs still have passed?"""

from __future__ import annotations

import onnx

from verifiers.gelu.catalogue import EXACT, TANH
from verifiers.gelu.site_flavour import SiteFlavour
from verifiers.formats.onnx.gelu_writer import replace_sites

SWAPPED = {EXACT: TANH, TANH: EXACT}


def swapped_variant(model: onnx.ModelProto, entries: list[SiteFlavour]) -> onnx.ModelProto | None:
    """The model with every exact GELU written as tanh and every tanh as exact; None when it has none."""
    swappable = [(e.site, SWAPPED[e.flavour]) for e in entries if e.flavour in SWAPPED]
    return replace_sites(model, swappable) if swappable else None
