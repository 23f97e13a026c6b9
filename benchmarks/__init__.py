"""The benchmarks: each answers one question with printed numbers (docs/benchmarks.md lists them, with what each
answers and how long it takes). Run from the repository root as modules, e.g.
`python -m benchmarks.selection_stability ...`; the corpora they read are built by the corpora package."""
