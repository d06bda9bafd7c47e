"""How a TFLite model computes (verifiers.precision.Precision), read from the flatbuffer: its mode,
its inputs' and outputs' quantization, every op on a float tensor; and the dynamic axes and
activation shapes the integer-device checks read."""

from __future__ import annotations

from verifiers.precision import FLOAT_DTYPES, FloatOp, Precision, QuantizedIO, mode_of, representable


def tflite_precision(model, labels: list[list[str]]) -> Precision:
    """The precision of a verifiers.tflite_model.TFLiteModel; `labels`: a label per op, per subgraph.

    Not float ops: a QUANTIZE of a model input and a DEQUANTIZE to a model output (the float I/O
    boundary), and a DEQUANTIZE of a constant (a float16 or int8 weight: its consumer is the float op).
    """
    main = model.subgraphs[0]
    float_ops: list[FloatOp] = []
    float_weights: set[str] = set()
    int8_weights = False
    integer_activations: set[str] = set()
    for g, sg in enumerate(model.subgraphs):
        tensors = sg.tensors

        def constant(t: int) -> bool:
            return model.buffers[tensors[t].buffer][1] > 0

        dequantized: dict[int, str] = {}  # DEQUANTIZE output -> the dtype of the constant it reads
        for op in sg.operators:
            oc = model.opcode(op)
            inputs = [t for t in op.inputs if t >= 0]
            outputs = [t for t in op.outputs if t >= 0]
            if g == 0 and oc.name == "QUANTIZE" and inputs and inputs[0] in main.inputs:
                continue
            if g == 0 and oc.name == "DEQUANTIZE" and outputs and set(outputs) <= set(main.outputs):
                continue
            if oc.name == "DEQUANTIZE" and inputs and constant(inputs[0]) and outputs:
                dequantized[outputs[0]] = tensors[inputs[0]].dtype
                continue
            weights = {t: dequantized.get(t, tensors[t].dtype) for t in inputs if constant(t) or t in dequantized}
            activations = [t for t in inputs if t not in weights]
            floating = [t for t in activations if tensors[t].dtype in FLOAT_DTYPES]
            floating += [t for t, dtype in weights.items() if dtype in FLOAT_DTYPES]
            floating += [t for t in outputs if tensors[t].dtype in FLOAT_DTYPES]
            if not floating:
                integer_activations |= {tensors[t].dtype for t in activations}
                continue
            float_weights |= {dtype for dtype in weights.values() if dtype in FLOAT_DTYPES}
            int8_weights |= any(dtype in ("int8", "uint8") for dtype in weights.values())
            tensor = tensors[floating[0]]
            float_ops.append(FloatOp(labels[g][op.index], oc.name, tensor.name, tensor.dtype))
    return Precision(mode_of(float_ops, float_weights, int8_weights, False, integer_activations),
                     _tflite_io(model, "inputs"), _tflite_io(model, "outputs"), tuple(float_ops))


def _tflite_io(model, side: str) -> tuple[QuantizedIO, ...]:
    """The first signature's inputs or outputs (subgraph 0's when the file has no signature)."""
    if model.signatures:
        sd = model.signatures[0]
        sg, indices = model.subgraphs[sd.subgraph], [i for _, i in getattr(sd, side)]
    else:
        sg = model.subgraphs[0]
        indices = [i for i in getattr(sg, side) if i >= 0]
    return tuple(QuantizedIO(t.name, t.dtype, t.scale, t.zero_point) for t in (sg.tensors[i] for i in indices))


def tflite_dynamic_axes(model) -> list[tuple[str, int]]:
    """(input, axis) for every dimension -1 in a model input's shape_signature."""
    return [(io_tensor.name, axis) for io_tensor in _tflite_input_tensors(model)
            for axis, size in enumerate(io_tensor.shape_signature or ()) if size < 0]


def _tflite_input_tensors(model) -> list:
    if model.signatures:
        sd = model.signatures[0]
        return [model.subgraphs[sd.subgraph].tensors[i] for _, i in sd.inputs]
    sg = model.subgraphs[0]
    return [sg.tensors[i] for i in sg.inputs if i >= 0]


def tflite_activation_shapes(model) -> list[tuple[str, tuple[int, ...]]]:
    """(name, dims) of every tensor an op reads or writes that is not a constant (subgraph 0)."""
    sg = model.subgraphs[0]
    used = sorted({t for op in sg.operators for t in (*op.inputs, *op.outputs) if t >= 0})
    return [(sg.tensors[t].name, sg.tensors[t].dims) for t in used if model.buffers[sg.tensors[t].buffer][1] == 0]


def tflite_input_ranges(model) -> dict[str, tuple[float, float]]:
    """The real range each quantized input can take, by input name: the input's own scale (integer
    I/O), or that of the QUANTIZE the model applies to its float input first."""
    sg = model.subgraphs[0]
    ranges = {}
    for index in (i for i in sg.inputs if i >= 0):
        tensor = sg.tensors[index]
        if not (tensor.quantized and tensor.scale):
            quantize = next((op for op in sg.operators if model.opcode(op).name == "QUANTIZE" and op.inputs
                             and op.inputs[0] == index), None)
            if quantize is None:
                continue
            tensor = sg.tensors[quantize.outputs[0]]
            if not (tensor.quantized and tensor.scale):
                continue
        ranges[sg.tensors[index].name] = representable(tensor.scale, tensor.zero_point or 0, tensor.dtype)
    return ranges
