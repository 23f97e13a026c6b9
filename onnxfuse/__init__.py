"""onnxfuse: declarative YAML fusion patterns for ONNX models, validated and measured with onnxruntime."""

__version__ = "0.1.0"
