"""Which module of the source an artifact op's weights belong to.

Exporters fold things into weights (a LayerNorm's scale into the linear layer after it, the
attention scale into the query projection, a BatchNorm into its convolution) and MLIR merges the
names of what it folded, so an op's recorded names may not say which module it computes. Its
weights still do: a folded weight is the source parameter scaled along an axis, which leaves it
pointing the same way. The owner is the module whose parameter, in some layout of the artifact's
(a transpose included, for a weight stored or faulted transposed), has the largest |cosine| with
the weight, when that reaches OWNER_COSINE.
"""

from __future__ import annotations

import numpy as np

from verifiers.localization.layouts import layouts

OWNER_COSINE = 0.9


def owner(weights: tuple[np.ndarray, ...], parameters: dict[str, list[np.ndarray]]) -> str | None:
    """The module (a key of `parameters`, module -> its parameters) the weights most resemble."""
    best, found = OWNER_COSINE, None
    for weight in weights:
        flat = np.asarray(weight, np.float64).ravel()
        norm = np.linalg.norm(flat)
        if not norm:
            continue
        for module, arrays in parameters.items():
            for parameter in arrays:
                if parameter.size != weight.size or parameter.ndim < 2:
                    continue
                for candidate in _arrangements(np.asarray(parameter, np.float64), weight.shape):
                    other = np.linalg.norm(candidate)
                    cosine = abs(float(candidate.ravel() @ flat)) / (other * norm) if other else 0.0
                    if cosine > best:
                        best, found = cosine, module
    return found


def _arrangements(parameter: np.ndarray, shape: tuple[int, ...]):
    """The parameter in each layout of the weight's shape, and transposed when it is a square matrix."""
    for layout in layouts(parameter.shape, shape):
        yield layout.to_artifact(parameter)
    if parameter.ndim == 2 and parameter.shape[0] == parameter.shape[1] and tuple(shape) == parameter.shape:
        yield parameter.T
