"""How an op's or a tensor's name is shown in a message (the report's data keeps the name whole).

Converters write long names: litert-torch a module path whose every level is its class's full
Python path (`transformers.models.bert.modeling_bert.BertLayer_0`), the TF converter the names of
every op it fused joined with ";". A message shows the first fused name with each level's package
path taken off (`BertLayer_0`), and, past SHOWN_LENGTH characters, its end.
"""

from __future__ import annotations

import re

SHOWN_LENGTH = 120
_PACKAGE_PATH = re.compile(r"(?<![^/:])(?:[A-Za-z_]\w*\.)+(?=[A-Z])")  # `pkg.mod.` before a class, per level


def shown(name: str) -> str:
    first = name.split(";", 1)[0] or name
    short = _PACKAGE_PATH.sub("", first)
    return short if len(short) <= SHOWN_LENGTH else "…" + short[-(SHOWN_LENGTH - 1):]
