"""Measure what each ONNX GELU site computes by running it alone on the catalogue's probes.

Each site's nodes, with the scalar constants they read, become a small model from the site's
input to its output, run in onnxruntime (CPU) with graph optimizations disabled so the probe
measures the nodes as written. (With default optimizations onnxruntime fuses erf chains into
com.microsoft Gelu, which computes the same exact GELU.) Side inputs that are not scalar
constants, i.e. the bias of FastGelu/BiasGelu, are fed as zeros so the probe measures the
activation alone. float16 sites are probed in float16, where outputs cannot separate exact
from tanh: those classifications come back not confident and the verdict rests on structure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from verifiers.onnx_model import elem_types, iter_nodes, with_imported_domains
from verifiers.runtimes import ProbeFailed, Runner, runtime_for
from verifiers.runtimes.isolation import counted

from verifiers.gelu.catalogue import UNKNOWN, Site
from verifiers.gelu.classification import FLOAT16_TOLERANCE, FLOAT32_TOLERANCE, Classification, classify, probe_inputs
from verifiers.gelu.int8 import Int8Grid
from verifiers.onnx_model import node_label
from verifiers.formats.onnx.gelu_sites import scalar_constants

# Element types a site can be probed in, with the match tolerance for its outputs.
_PROBE_TYPES = {
    onnx.TensorProto.FLOAT: (np.float32, FLOAT32_TOLERANCE),
    onnx.TensorProto.FLOAT16: (np.float16, FLOAT16_TOLERANCE),
    onnx.TensorProto.DOUBLE: (np.float64, FLOAT32_TOLERANCE),
}


@dataclass(frozen=True)
class Fingerprint:
    """What a site computes, measured: the probe dtype and the classification of its outputs."""

    site: Site
    dtype: str
    classification: Classification
    int8: Int8Grid | None = None  # the 8-bit grid a QDQ pair rounds its output to (verifiers.gelu.int8)

    @property
    def measured(self) -> str:
        return self.classification.flavour


class ModelIndex:
    """What probing reads from a model, read once for all its sites: nodes by label (subgraphs
    included), scalar constants, opset imports."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.by_label = {node_label(n): n for n in reversed(list(iter_nodes(model.graph)))}
        self.constants = scalar_constants(model.graph)
        self.opset_import = with_imported_domains(model).opset_import


def probe_model(model: onnx.ModelProto | ModelIndex, site: Site, elem_type: int,
                output_type: int | None = None) -> onnx.ModelProto:
    """The site's nodes as a model from site.input (shape [n, 1]) to site.output (of output_type,
    by default the input's: a site may end in a Cast).

    Scalar constants keep their values; any other side input (a bias) becomes zeros [1].
    """
    index = model if isinstance(model, ModelIndex) else ModelIndex(model)
    nodes = [index.by_label[label] for label in site.nodes]
    constants = index.constants
    produced = {out for n in nodes for out in n.output}
    zeros_dtype = _PROBE_TYPES[elem_type][0]
    initializers = {}
    for name in (name for n in nodes for name in n.input):
        if not name or name == site.input or name in produced or name in initializers:
            continue
        value = constants.get(name)
        if value is None:
            value = np.zeros([1], zeros_dtype)
        initializers[name] = numpy_helper.from_array(value, name)
    graph = helper.make_graph(
        nodes, "gelu_probe",
        [helper.make_tensor_value_info(site.input, elem_type, ["n", 1])],
        [helper.make_tensor_value_info(site.output, output_type or elem_type, None)],
        list(initializers.values()),
    )
    return helper.make_model(graph, opset_imports=index.opset_import, ir_version=index.model.ir_version)


def fingerprint_site(model: onnx.ModelProto | ModelIndex, site: Site, elem_type: int,
                     output_type: int | None = None, runner: type[Runner] | None = None) -> Fingerprint:
    """Probe one site whose input (and output, when given) has the given ONNX element type, on the
    core and tail probes, in `runner`'s runtime (the ONNX default when None); the output's
    precision sets the match tolerance."""
    type_name = onnx.helper.tensor_dtype_to_np_dtype(elem_type).name if elem_type else "undefined"
    output_type = output_type if output_type in _PROBE_TYPES else elem_type
    if elem_type not in _PROBE_TYPES:
        return Fingerprint(site, type_name, Classification(UNKNOWN, {}, False, f"cannot probe {type_name} sites"))
    np_dtype = _PROBE_TYPES[elem_type][0]
    tolerance = _PROBE_TYPES[output_type][1]
    x = probe_inputs(np_dtype).reshape(-1, 1)
    try:
        probe = probe_model(model, site, elem_type, output_type).SerializeToString()
        y = (runner or runtime_for("onnx")).run_probe(probe, x)
    except ProbeFailed as error:
        return Fingerprint(site, type_name, Classification(UNKNOWN, {}, False, f"probe did not run: {error}"))
    return Fingerprint(site, type_name, classify(x, y, tolerance))


def fingerprint_sites(model: onnx.ModelProto, sites: list[Site], runner: type[Runner] | None = None) -> list[Fingerprint]:
    """Probe every site in `runner`'s runtime (one small probe session each, about 1 ms in onnxruntime).

    A site whose input type is neither declared nor inferable is probed as float32.
    """
    types = elem_types(model, {s.input for s in sites} | {s.output for s in sites})
    index = ModelIndex(model)
    runner = runner or runtime_for("onnx")
    return [fingerprint_site(index, s, types.get(s.input, onnx.TensorProto.FLOAT), types.get(s.output), runner)
            for s in counted(sites)]
