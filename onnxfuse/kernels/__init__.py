"""onnxruntime's published kernel table (`ort_kernels.json`) and the script that generates it (`generate.py`);
`onnxfuse.targets` reads the table when the installed onnxruntime lacks a target's execution provider."""
