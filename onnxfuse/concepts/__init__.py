"""Concepts: what the match language proves instead of matching op types, one module each, registered here.

- `layout.py` (layout, scaled), `masked.py`, `computes.py`: each declares its parser, its matcher and its
  rows of the language's docs in one `ConceptKind` (language.py). A new concept is one module like them,
  added to `CONCEPTS` below, and its test (docs/architecture.md: "Adding a concept").
- The proofs they run: `layout_proof.py` (data movement and scalar factors, on the shape interpreter of
  `interpreter.py` and `shape_ops.py`), `causal.py` (a mask hides every later key), `function_regions.py` (a
  region computes a function of `function_table.py`); `layout_text.py` parses a layout's text.

Imports only the base modules (ir, opschema, tensors): patterns/ and match/ import this package, never the
other way round.
"""

from .computes import COMPUTES
from .language import ConceptKind
from .layout import LAYOUT, SCALED
from .masked import MASKED

CONCEPTS: dict[str, ConceptKind] = {k.name: k for k in (LAYOUT, SCALED, MASKED, COMPUTES)}

__all__ = ["CONCEPTS", "ConceptKind"]
