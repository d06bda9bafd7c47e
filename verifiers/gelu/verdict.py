"""The GELU verdict: align the source's activation sites with the artifact's and say what changed.

Both sides are lists of activation sites in graph order, GELU, SiLU and ReLU sites together, each
with the flavour it computes (for the artifact: measured when the measurement is confident, else
claimed by structure). Sites no output depends on (dead code: exporters drop it) are listed as
unused and not judged. The used sites of the two sides are aligned by order and flavour with an
edit distance, so a GELU that turned into a ReLU or a SiLU, disappeared or appeared is placed where
it happened. Every aligned pair that involves a GELU becomes one SiteVerdict; ReLU-to-ReLU and
SiLU-to-SiLU pairs are not listed. A site computing its flavour times another constant than the
source's is kept only when the linear op(s) taking its whole output absorb the scale (a converter
folded GELU's 0.5 into the next layer's weights; the outputs comparison checks the product).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .catalogue import OTHER_ACTIVATIONS, SiteFlavour

KEPT, CHANGED, DECLARED, REMOVED, ADDED, UNUSED = "kept", "changed", "declared", "removed", "added", "unused"
_SCALE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class SiteVerdict:
    status: str  # kept, changed, declared, removed, added, unused
    source: SiteFlavour | None
    artifact: SiteFlavour | None

    @property
    def failed(self) -> bool:
        return self.status in (CHANGED, REMOVED, ADDED)

    def message(self) -> str:
        src, art = self.source, self.artifact
        if self.status == UNUSED:
            side, where = (src, "source") if src is not None else (art, "artifact")
            return (f"GELU unused: {where} site {_describe(side)} ({side.flavour}) reaches no output; "
                    "not judged")
        if self.status == REMOVED:
            return f"GELU gone: source site {_describe(src)} ({src.flavour}) has no counterpart in the artifact"
        if self.status == ADDED:
            return f"GELU added: artifact site {_describe(art)} computes {art.flavour}; the source has none there"
        verb = {KEPT: "kept", DECLARED: "changed as declared", CHANGED: "changed"}[self.status]
        text = (f"GELU {verb}: source {_describe(src)} is {src.flavour}, artifact {_describe(art)} "
                f"computes {art.flavour}")
        deviation = art.residuals.get(src.flavour)
        if self.status != KEPT and deviation is not None:
            text += f" ({deviation:.2g} from {src.flavour} on the probes)"
        if art.tail:
            text += f"; its tail is off: {art.tail}"
        if _scale_differs(src, art):
            ratio = art.scale / src.scale
            text += (f"; it computes {ratio:.6g} x the source's curve"
                     + (f", a scale absorbed by the {art.site.absorbed_by} it feeds" if self.status == KEPT
                        else ", and nothing linear after it absorbs the scale"))
        if not art.confident:
            text += f"; {art.note or 'measurement inconclusive, judged by structure'}"
        return text

    def to_dict(self) -> dict:
        art, src = self.artifact, self.source
        return {
            "status": self.status,
            "site": art.site.site_id if art else None,
            "op": art.site.op if art else None,
            "claimed": art.site.claimed if art else None,
            "measured": art.measured if art else None,
            "confident": art.confident if art else None,
            "residuals": dict(art.residuals) if art else {},
            "source_site": src.site.site_id if src else None,
            "source_op": src.site.op if src else None,
            "source_flavour": src.flavour if src else None,
            "scale": art.scale if art else None,
            "tail": art.tail if art else "",
            "source_scale": src.scale if src else None,
            "note": art.note if art else "",
            "message": self.message(),
            # What the artifact's site computed on the core probes (non-finite values as None).
            "probes": {"x": [x for x, _ in art.samples], "y": [y if math.isfinite(y) else None for _, y in art.samples]}
            if art and art.samples else None,
        }


def _scale_differs(src: SiteFlavour, art: SiteFlavour) -> bool:
    if not (math.isfinite(src.scale) and math.isfinite(art.scale)) or src.scale == 0:
        return True
    return abs(art.scale / src.scale - 1.0) > _SCALE_TOLERANCE


def _describe(side: SiteFlavour) -> str:
    return f"{side.site.site_id} ({side.site.op})"


def align(source: list[SiteFlavour], artifact: list[SiteFlavour]) -> list[tuple[SiteFlavour | None, SiteFlavour | None]]:
    """Edit-distance alignment by flavour: equal flavours pair for free; a substitution costs
    less than a removal plus an addition, so a changed site stays paired with its source."""
    n, m = len(source), len(artifact)
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        for j in range(m + 1):
            if i == 0 or j == 0:
                cost[i][j] = i + j
                continue
            same = source[i - 1].flavour == artifact[j - 1].flavour
            cost[i][j] = min(cost[i - 1][j - 1] + (0 if same else 1), cost[i - 1][j] + 1, cost[i][j - 1] + 1)
    pairs = []
    i, j = n, m
    while i or j:
        if i and j:
            same = source[i - 1].flavour == artifact[j - 1].flavour
            if cost[i][j] == cost[i - 1][j - 1] + (0 if same else 1):
                pairs.append((source[i - 1], artifact[j - 1]))
                i, j = i - 1, j - 1
                continue
        if i and cost[i][j] == cost[i - 1][j] + 1:
            pairs.append((source[i - 1], None))
            i -= 1
        else:
            pairs.append((None, artifact[j - 1]))
            j -= 1
    return pairs[::-1]


def judge(
    source: list[SiteFlavour], artifact: list[SiteFlavour], declared: dict[str, str] | None = None
) -> list[SiteVerdict]:
    """One verdict per aligned pair that involves a GELU, and one per unused GELU site. `declared`
    maps a source flavour to the flavour the user asked for (e.g. {"exact": "tanh"}): such changes
    are listed, not failed."""
    declared = declared or {}
    verdicts = []
    for src, art in align([s for s in source if s.site.used], [a for a in artifact if a.site.used]):
        if src is not None and art is not None:
            if src.flavour in OTHER_ACTIVATIONS and art.flavour == src.flavour:
                continue
            if src.flavour == art.flavour:
                status = CHANGED if _scale_differs(src, art) and not art.site.absorbed_by else KEPT
            elif declared.get(src.flavour) == art.flavour:
                status = DECLARED
            else:
                status = CHANGED
        elif src is not None:
            if src.flavour in OTHER_ACTIVATIONS:
                continue  # a ReLU gone is a numeric matter, not a GELU one
            status = REMOVED
        else:
            if art.flavour in OTHER_ACTIVATIONS:
                continue
            status = ADDED
        verdicts.append(SiteVerdict(status, src, art))
    unused = [SiteVerdict(UNUSED, s, None) for s in source if not s.site.used and s.flavour not in OTHER_ACTIVATIONS]
    unused += [SiteVerdict(UNUSED, None, a) for a in artifact if not a.site.used and a.flavour not in OTHER_ACTIVATIONS]
    return verdicts + unused
