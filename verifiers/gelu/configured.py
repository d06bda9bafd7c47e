"""What a model's config declares its activations to be, held against the sites that compute them.

A transformers config names its activations (`hidden_act: gelu_new`, `activation_function:
quick_gelu`, ...); the catalogue's TRANSFORMERS claims say which flavour each name computes. A GELU
site of the source or the artifact whose flavour is none of the GELU flavours the config declares
is reported: on the artifact's side beside the guard's verdict, on the source's side as a note (the
model's code does not compute what its config says, and the artifact is judged against the code).
Configs that declare no GELU flavour, and names the catalogue does not claim, are not judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .catalogue import GELU_FAMILY, TRANSFORMERS, claimed_by
from .site_flavour import SiteFlavour

# The config keys that name an activation function, at any depth (text_config.hidden_act, ...).
ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function", "dense_act_fn",
                   "projector_hidden_act", "feat_extract_activation")


@dataclass(frozen=True)
class Declared:
    """The GELU flavours a config declares: {key path: (activation name, flavour)}."""

    keys: Mapping[str, tuple[str, str]]

    @property
    def flavours(self) -> set[str]:
        return {flavour for _, flavour in self.keys.values() if flavour in GELU_FAMILY}

    def says(self) -> str:
        return ", ".join(f"{key} {name} ({flavour})" for key, (name, flavour) in self.keys.items())

    def off(self, sites: Iterable[SiteFlavour]) -> list[SiteFlavour]:
        """The GELU sites computing a flavour the config declares for none of its activations."""
        declared = self.flavours
        if not declared:
            return []
        return [s for s in sites if s.flavour in GELU_FAMILY and s.flavour not in declared]

    def to_dict(self) -> dict:
        return {key: {"name": name, "flavour": flavour} for key, (name, flavour) in self.keys.items()}


def declared_by(config: Mapping) -> Declared:
    """The activations a config (a transformers config.json as a dict) names, with the flavour the
    catalogue says each computes; names it does not claim are left out."""
    keys: dict[str, tuple[str, str]] = {}

    def walk(node: Mapping, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping):
                walk(value, f"{prefix}{key}.")
            elif key in ACTIVATION_KEYS and isinstance(value, str):
                claimed = claimed_by(TRANSFORMERS, value)
                if claimed is not None:
                    keys[f"{prefix}{key}"] = (value, claimed[0].name)

    walk(config, "")
    return Declared(keys)
