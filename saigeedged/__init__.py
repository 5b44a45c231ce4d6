"""saigeedged: compile ONNX models dropped into an inbox into edge-NPU bundles."""

__version__ = "0.1.0"
