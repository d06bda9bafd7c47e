"""A GELU (or other activation) site with the flavour it computes, and how that was established:
what the inventories, the verdict and the reports pass around."""

from __future__ import annotations

from dataclasses import dataclass, field

from .catalogue import Site
from .int8 import Int8Grid


@dataclass(frozen=True)
class SiteFlavour:
    """A site with the flavour it computes, and how that was established."""

    site: Site
    flavour: str
    measured: str | None = None  # what the probes said (artifact sites)
    residuals: dict[str, float] = field(default_factory=dict)
    confident: bool = True  # False when the probes could not separate the flavours (float16, int8)
    note: str = ""
    scale: float = 1.0  # the site computes scale * flavour
    tail: str = ""  # what its tail probes got wrong (NaN, Inf, a wrong value), empty when nothing
    samples: tuple[tuple[float, float], ...] = ()  # (x, y) it computed on the core probes (artifact sites)
    int8: Int8Grid | None = None  # the 8-bit quantization its output is rounded to (verifiers.gelu.int8)
    table_differences: dict[str, int] = field(default_factory=dict)  # measured as an 8-bit table: entries off per flavour
