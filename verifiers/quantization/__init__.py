"""How a quantized (int8) artifact is judged, the artifact layer's part: its outputs by SQNR and
top-1 agreement (metrics) and where it loses its accuracy, layer by layer against a float twin
(layers). Whether a TFLite file keeps LiteRT's int8 spec is its format's knowledge
(verifiers.formats.tflite.int8_spec); the model layer's part (int8 exports, calibration, the float
twin) is exporter.quantization, the check that runs it exporter.checks.quantization."""
