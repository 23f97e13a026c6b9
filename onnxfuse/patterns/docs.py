"""Generate docs/patterns.md and onnxfuse/patterns/schema.json from the pattern vocabulary (spec.py).

    python -m onnxfuse.patterns.docs           # rewrite both files
    python -m onnxfuse.patterns.docs --check   # exit 1 if either is out of date
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from ..concepts import CONCEPTS
from ..concepts.function_table import FUNCTIONS, REGION_OPS
from . import spec
from .vocab import Field, Function, Key, Table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS_PATH = os.path.join(ROOT, "docs", "patterns.md")
SCHEMA_PATH = os.path.join(ROOT, "onnxfuse", "patterns", "schema.json")

# The worked example: the built-in rule conv-bn-fold (patterns/conv.yaml). The examples of the rule,
# constraint and target keys are written for it, and the tests parse each one in its place here.
WORKED_EXAMPLE = """\
rules:
- id: conv-bn-fold
  doc: Inference BatchNormalization after Conv folds into the Conv's weights and bias.
  match:
    c: Conv(X, W, B?)
    Y: BatchNormalization(c, SCALE, BIAS, MEAN, VAR)
  where:
    W: {constant: true}
    B: {constant: true}
    SCALE: {constant: true, rank: 1}
    BIAS: {constant: true, rank: 1}
    MEAN: {constant: true, rank: 1}
    VAR: {constant: true, rank: 1}
    Y: {attrs: {training_mode: 0}}
  compute:
    s: SCALE / sqrt(VAR + Y.epsilon)
    W2: W * reshape(s, [-1] + [1] * (W.rank - 1))
    B2: (default(B, 0) - MEAN) * s + BIAS
  example: {X: [1, 4, 8, 8], W: [4, 4, 3, 3], B: [4], SCALE: [4], BIAS: [4], MEAN: [4], VAR: [4]}
  rewrite:
    Y: Conv(X, W2, B2, copy_attrs=c)
"""

INTRO = """\
A pattern file is YAML: a list of rules. A rule **matches** a small subgraph (`match`), checks it (`where`,
`require`), computes new constant tensors (`compute`) and **replaces** the match (`rewrite`). Rules are tried
bigger matches first, then in file order, to a fixed point. Use your own files with
`onnxfuse optimize --patterns FILE`; `onnxfuse patterns check FILE` reports mistakes as
`file:line:col: error: message (hint: ...)`, and `onnxfuse patterns test FILE` self-tests each rule on small
generated models. The guide is [writing-patterns.md](writing-patterns.md); this page is the reference of every
word of the language.

For completion and checking in editors, point the YAML language server at the JSON Schema
(`onnxfuse patterns schema > onnxfuse-patterns.schema.json`):

```yaml
# yaml-language-server: $schema=onnxfuse-patterns.schema.json
```
"""

WORKED_NOTES = """\
- `match`: two lines, one node each; the last line (`Y`) is the root. `c` is lowercase, an interior node: its
  output must have no reader outside the match. `X`, `W`, `B`, `SCALE`, ... are not lines: they are the values
  entering the match. `B?` is an optional input (a Conv without bias matches too).
- `where`: the weights and the BatchNormalization parameters must be constants (`compute` reads their values),
  the parameters of rank 1, and `Y` must have `training_mode` 0 (its default counts when it is absent).
- `compute`: the new weights, in float64 and stored in the dtype of `W`. `Y.epsilon` reads an attribute of
  the matched node (its schema default where absent); `default(B, 0)` stands in for the absent bias.
- `rewrite`: one Conv reading the new constants; `copy_attrs=c` copies the matched Conv's attributes
  (strides, pads, group, ...). `Y` is re-created, so its readers now read the new Conv.
- `example`: input shapes for the models `onnxfuse patterns test` builds.
"""

MATCH_SYNTAX = """\
| syntax | meaning |
|---|---|
| `Op(A, B)` | a node of ONNX operator `Op` reading `A` and `B`; a nested call is an interior node of its own |
| `com.microsoft.Op(A)` | an operator of another domain; the domains: ONNX's (no prefix), {domains} |
| `B?` | an optional input: matches when the input is absent too |
| `_` | any value (not bound to a name) |
| `Op(X) \\| Op2(X)` | alternatives, tried in order with backtracking |
| `Op(X, axis=-1)` | an attribute value the node must have (a literal; the schema default counts) |
| `q, k, v: Split(...)` | a line naming every output of one multi-output node |

Commutative operators (Add, Mul, Max, Min, Sum, Mean, And, Or, Xor, Equal, Bitwise*) try both operand orders.
A name used twice is the same value.

### Concepts

A concept matches what a chain of nodes *does*, whatever ops spell it; the matcher proves it
(onnxfuse/concepts/: one module per concept, each declaring the rows below) instead of comparing op types:

| syntax | meaning |
|---|---|
{concept_rows}

The proof runs the chain with numpy on `arange` over the source's elements, at two sets of sizes for the
graph's symbolic dims, and compares the result with the rearrangement: 3-D or 4-D heads, reshape targets
constant or computed from `Shape`, a Transpose before or after the Reshape are all the same fact. A scalar
factor is a one-element operand that folds to the same number at both sizes: a constant, or shape arithmetic
of static dims (`1 / Sqrt(Cast(Gather(Shape(q), -1)))`). The axis names are dims of the rule, shared with
`shape:` constraints and across lines (`q` and `k` must have the same `n`), and read by name in `compute`,
`require` and the rewrite's attributes (`num_heads=n`); a fact is read by its name (`scale=SQ * SK`).
`example` may give an axis size (`n: 4`) for the models `patterns test` builds. A chain whose value is also
read outside the match is kept for that reader. A mask's terms are tried in every split, the most terms first:
a [b, 1, 1, t] padding row, a rank-2 causal [s, t], a relative position bias plus a mask, a Where with a bool
mask are all one mask. A function's region is run on random rows with an offset each (and, for a
normalization, on rows scaled so that eps matters) and compared with the function within 1e-5 (2e-3 where float16
takes part); of two functions of one family (Gelu and its tanh approximation) the nearer one is the one it
computes. A region value read outside the match fails the match. When a concept is not met, `explain` says why in its terms: "layout 'b s (n d) -> b n s
d': the elements are not arranged as ...", "axis n is 4 here, 12 in an earlier line", "masked: the Where fill
-10000 is not a mask minimum", "computes 'layernorm': the ops from 'x' compute something else (off by 0.3)".
"""

EXPRESSIONS = """\
`compute`, `require`, a target's `require` and the attribute values of `rewrite` are expressions of a small,
safe language, parsed with Python's `ast` and interpreted (never `eval`): numbers, strings, `[lists]`,
`(tuples)`, `+ - * / // % ** @`, unary `- + not`, `and`, `or`, comparisons, `a if cond else b`, indexing and
slicing. A name is a value of the match (its constant value: `constant: true` or `const` in `where`), an
earlier `compute` name, or, with a field, a value or a match line. Floating values are computed in float64
and a computed tensor is stored in the dtype of the first floating input it read.
"""


def _code(text: str) -> str:
    """Inline code for a table cell."""
    return "`" + text.replace("|", "\\|") + "`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _show(value: object) -> str:
    """A function example's result as the language writes it."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return repr(value)


def _key_sections(table: Table[Key], level: str) -> list[str]:
    out = [f"{level} {table.title}", "", table.doc, ""]
    for key in table.entries:
        out += [f"{level}# `{key.name}`" + (" (required)" if key.required else ""), "", key.doc, "",
                "```yaml", key.example.rstrip("\n"), "```", ""]
    return out


def _key_table(table: Table[Key], level: str) -> list[str]:
    out = [f"{level} {table.title}", "", table.doc, "", "| key | meaning | example |", "|---|---|---|"]
    out += [f"| `{k.name}` | {_cell(k.doc)} | {_code(k.example.strip())} |" for k in table.entries]
    return out + [""]


def _field_table(table: Table[Field], level: str) -> list[str]:
    out = [f"{level} {table.title}", "", table.doc, "", "| field | meaning | example |", "|---|---|---|"]
    out += [f"| `{f.name}` | {_cell(f.doc)} | {_code(f.example)} |" for f in table.entries]
    return out + [""]


def _function_table(table: Table[Function], level: str) -> list[str]:
    out = [f"{level} {table.title}", "", table.doc, "", "| function | meaning | example |", "|---|---|---|"]
    for f in table.entries:
        example = _code(f.example) + ("" if f.result is None else " → " + _code(_show(f.result)))
        out.append(f"| `{f.signature}` | {_cell(f.doc)} | {example} |")
    return out + [""]


def _concept_rows() -> str:
    """The concepts' rows of the syntax table, as each concept module declares them (concepts/)."""
    fill = {"region_ops": ", ".join(sorted(REGION_OPS)),
            "functions": "; ".join(f"`{f.name}`: {f.doc}" for f in FUNCTIONS.values())}
    return "\n".join(f"| {syntax} | {meaning.format(**fill)} |" for kind in CONCEPTS.values()
                     for syntax, meaning in kind.docs)


def markdown() -> str:
    lines = [
        "# Pattern language reference", "",
        "<!-- Generated by `python -m onnxfuse.patterns.docs` from the vocabulary tables (onnxfuse/patterns:",
        "     keys in parser.py, functions and fields in compute.py). Do not edit by hand. -->", "",
        INTRO,
        "## Worked example", "",
        "The built-in rule `conv-bn-fold` (patterns/conv.yaml), slightly shortened:", "",
        "```yaml", WORKED_EXAMPLE.rstrip("\n"), "```", "",
        WORKED_NOTES,
        "## Match expressions", "",
        MATCH_SYNTAX.format(domains=", ".join(f"`{d}`" for d in spec.PATTERN_DOMAINS if d),
                            concept_rows=_concept_rows()),
        "## Keys", "",
    ]
    lines += _key_sections(spec.FILE_KEYS, "###")
    lines += _key_sections(spec.RULE_KEYS, "###")
    lines += _key_table(spec.CONSTRAINT_KEYS, "###")
    lines += _key_table(spec.TARGET_KEYS, "###")
    lines += [
        "### Values of keys", "",
        f"- dtypes (`dtype`): {', '.join(f'`{d}`' for d in spec.DTYPES)}",
        f"- targets (`targets`): {', '.join(f'`{t}`' for t in spec.TARGETS)}",
        f"- stages (`stage`): {', '.join(f'`{s}`' for s in spec.STAGES)}",
        f"- measuring (`measure`): {', '.join(f'`{m}`' for m in spec.MEASURES)}", "",
        "## Expressions", "", EXPRESSIONS,
    ]
    for table in spec.FIELD_TABLES:
        lines += _field_table(table, "###")
    lines += _function_table(spec.FUNCTIONS, "###")
    return "\n".join(lines).rstrip("\n") + "\n"


def outputs() -> dict[str, str]:
    """Generated file path -> its text."""
    return {DOCS_PATH: markdown(), SCHEMA_PATH: spec.json_schema_text()}


def stale() -> list[str]:
    """The generated files whose text differs from what the vocabulary gives."""
    out = []
    for path, text in outputs().items():
        try:
            with open(path, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m onnxfuse.patterns.docs", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    args = ap.parse_args(argv)
    if args.check:
        bad = stale()
        for path in bad:
            print(f"{os.path.relpath(path, ROOT)} is out of date: run python -m onnxfuse.patterns.docs",
                  file=sys.stderr)
        return 1 if bad else 0
    for path, text in outputs().items():
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
