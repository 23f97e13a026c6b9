"""The package list: every package under onnxfuse/ (found, never listed by hand: a hand-made list once left
onnxfuse.inputs out of the wheel), plus the built-in patterns folder shipped as onnxfuse.builtin_patterns
(mapped in pyproject.toml). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["onnxfuse", "onnxfuse.*"])
      + ["onnxfuse.builtin_patterns", "onnxfuse.builtin_patterns.optional"])
