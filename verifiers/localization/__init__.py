"""Localisation: where an artifact's computation first departs from its source model's, in which
module and source line, and by how much that op errs on its own.

- trace: what the source computed, op by op (captured by the model layer, exporter.tracing);
- graph: the artifact's graph as localisation sees it, one class per format (onnx_graph, tflite_graph);
- layouts: how an artifact tensor holds a source tensor's values, and matching by value;
- align: which artifact tensors hold which source tensors (anchors);
- divergence: the two runs, the error each segment introduces, the first divergence and its path.
"""
