"""Built-in YAML fusion patterns (data; shipped inside the wheel as onnxfuse.builtin_patterns)."""
