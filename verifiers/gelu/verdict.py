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

An artifact site whose output is rounded to 8 bits (`SiteFlavour.int8`) is judged at that
resolution (`verifiers.gelu.int8`): a flavour other than the source's whose gap from it is under
one output step is no change the site can show, and the pair is "indistinguishable", neither kept
nor failed. A site measured as an 8-bit table (a TFLite int8 GELU) whose table is the source
flavour's is "indistinguishable" too when another catalogued flavour gives the same table within
one step (exact and tanh at every usual scale): the table cannot vouch for the flavour. A site
measured in float before its quantization (ONNX QDQ) that computes the source's flavour is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from verifiers.naming import shown

from .catalogue import FLAVOURS, OTHER_ACTIVATIONS
from .int8 import TABLE_SIZE, referenced
from .site_flavour import SiteFlavour

KEPT, CHANGED, DECLARED, REMOVED, ADDED, UNUSED = "kept", "changed", "declared", "removed", "added", "unused"
INDISTINGUISHABLE = "indistinguishable"  # the flavours at stake give the same 8-bit output within one step
_SCALE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class SiteVerdict:
    status: str  # kept, changed, declared, indistinguishable, removed, added, unused
    source: SiteFlavour | None
    artifact: SiteFlavour | None
    # Flavours the artifact site's 8-bit output cannot tell from the source's, with their largest gap
    # on its input grid (what makes a pair indistinguishable).
    unresolved: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in (CHANGED, REMOVED, ADDED)

    def message(self) -> str:
        src, art = self.source, self.artifact
        if self.status == UNUSED:
            side, where = (src, "source") if src is not None else (art, "artifact")
            return (f"GELU unused: {where} site {describe(side)} ({side.flavour}) reaches no output; "
                    "not judged")
        if self.status == REMOVED:
            return f"GELU gone: source site {describe(src)} ({src.flavour}) has no counterpart in the artifact"
        if self.status == ADDED:
            return f"GELU added: artifact site {describe(art)} computes {art.flavour}; the source has none there"
        if self.status == INDISTINGUISHABLE:
            grid, others = art.int8, " or ".join(self.unresolved)
            how = (f"holds the {grid.dtype} table of {art.flavour}{_table_note(art, [src.flavour, *self.unresolved])}"
                   if art.table_differences else f"computes {art.flavour} in float, rounded to {grid.dtype} after")
            return (f"GELU flavour not distinguishable at int8: source {describe(src)} is {src.flavour}, artifact "
                    f"{describe(art)} {how}; {src.flavour} and {others} differ by at most {self.gap:.2g} on its "
                    f"input grid, under one output step ({grid.output_scale:.3g}): neither kept nor changed")
        verb = {KEPT: "kept", DECLARED: "changed as declared", CHANGED: "changed"}[self.status]
        text = (f"GELU {verb}: source {describe(src)} is {src.flavour}, artifact {describe(art)} "
                f"computes {art.flavour}")
        deviation = art.residuals.get(src.flavour)
        if self.status != KEPT and deviation is not None:
            text += f" ({deviation:.2g} from {src.flavour} {'on its int8 grid' if art.table_differences else 'on the probes'})"
        if art.tail:
            text += f"; its tail is off: {art.tail}"
        if _scale_differs(src, art):
            ratio = art.scale / src.scale
            text += (f"; it computes {ratio:.6g} x the source's curve"
                     + (f", a scale absorbed by the {art.site.absorbed_by} it feeds" if self.status == KEPT
                        else ", and nothing linear after it absorbs the scale"))
        if not art.confident:
            text += f"; {art.note or 'measurement inconclusive, judged by structure'}"
        if art.int8 is not None:
            text += f"; {art.int8.dtype} output step {art.int8.output_scale:.3g}"
            if art.table_differences and self.status != KEPT:
                text += f", {src.flavour}'s table differs in {art.table_differences.get(src.flavour, '?')} of {TABLE_SIZE} entries"
        return text

    @property
    def gap(self) -> float | None:
        """The largest gap between the source's flavour and those the site cannot tell from it."""
        return max(self.unresolved.values()) if self.unresolved else None

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
            # 8-bit sites: the quantization (resolution = its output_scale), the flavours it cannot tell
            # from the source's and their largest gap, and for a table the entries off per flavour.
            "int8": art.int8.to_dict() if art and art.int8 else None,
            "resolution": art.int8.output_scale if art and art.int8 else None,
            "unresolved": dict(self.unresolved),
            "gap": self.gap,
            "table_differences": dict(art.table_differences) if art else {},
            "message": self.message(),
            # What the artifact's site computed on the core probes (non-finite values as None).
            "probes": {"x": [x for x, _ in art.samples], "y": [y if math.isfinite(y) else None for _, y in art.samples]}
            if art and art.samples else None,
        }


def _scale_differs(src: SiteFlavour, art: SiteFlavour) -> bool:
    if not (math.isfinite(src.scale) and math.isfinite(art.scale)) or src.scale == 0:
        return True
    return abs(art.scale / src.scale - 1.0) > _SCALE_TOLERANCE


def describe(side: SiteFlavour) -> str:
    return f"{shown(side.site.site_id)} ({side.site.op})"


def _table_note(art: SiteFlavour, flavours: list[str]) -> str:
    return "".join(f" ({name}'s differs in {art.table_differences[name]} of {TABLE_SIZE} entries)"
                   for name in dict.fromkeys(flavours) if name != art.flavour and art.table_differences.get(name))


def unresolved(src: SiteFlavour, art: SiteFlavour) -> dict[str, float]:
    """The flavours an 8-bit artifact site cannot tell from the source's, with their gaps: the
    artifact's flavour when it differs; every other catalogued flavour when it is the source's and
    was read from an 8-bit table; none when the site is not 8-bit or a flavour has no curve."""
    if art.int8 is None or FLAVOURS[src.flavour].reference is None:
        return {}
    if src.flavour != art.flavour:
        others = [art.flavour] if FLAVOURS[art.flavour].reference is not None else []
    else:
        others = [name for name in referenced() if name != src.flavour] if art.table_differences else []
    return art.int8.unresolved(src.flavour, others)


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
        alike: dict[str, float] = {}
        if src is not None and art is not None:
            if src.flavour in OTHER_ACTIVATIONS and art.flavour == src.flavour:
                continue
            alike = unresolved(src, art)
            if src.flavour == art.flavour:
                scaled = _scale_differs(src, art) and not art.site.absorbed_by
                status = CHANGED if scaled else INDISTINGUISHABLE if alike else KEPT
            elif declared.get(src.flavour) == art.flavour:
                status = DECLARED
            else:
                status = INDISTINGUISHABLE if alike else CHANGED
        elif src is not None:
            if src.flavour in OTHER_ACTIVATIONS:
                continue  # a ReLU gone is a numeric matter, not a GELU one
            status = REMOVED
        else:
            if art.flavour in OTHER_ACTIVATIONS:
                continue
            status = ADDED
        verdicts.append(SiteVerdict(status, src, art, alike if status == INDISTINGUISHABLE else {}))
    unused = [SiteVerdict(UNUSED, s, None) for s in source if not s.site.used and s.flavour not in OTHER_ACTIVATIONS]
    unused += [SiteVerdict(UNUSED, None, a) for a in artifact if not a.site.used and a.flavour not in OTHER_ACTIVATIONS]
    return verdicts + unused
