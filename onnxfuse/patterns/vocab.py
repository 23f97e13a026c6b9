"""The building blocks of the pattern vocabulary: one table per kind of word (file keys, rule keys, constraint
keys, target keys, compute functions, value fields), each entry carrying its name, how it is parsed, its
JSON-schema fragment, one doc line and an example.

The tables themselves sit next to the code that gives their words meaning: the keys in `parser.py` (with their
parse functions), the functions and fields in `compute.py` (with their implementations). `spec.py` collects
them; the parser dispatches through them, and `schema.json` and `docs/patterns.md` are generated from them
(`python -m onnxfuse.patterns.docs`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import onnx
import yaml

from ..words import close_matches

# The element types a pattern can name (`where: {X: {dtype: ...}}`), in the order hints list them.
DTYPES: dict[str, int] = {
    "float32": onnx.TensorProto.FLOAT, "float": onnx.TensorProto.FLOAT,
    "float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16,
    "float64": onnx.TensorProto.DOUBLE, "double": onnx.TensorProto.DOUBLE,
    "int8": onnx.TensorProto.INT8, "uint8": onnx.TensorProto.UINT8, "int16": onnx.TensorProto.INT16,
    "int32": onnx.TensorProto.INT32, "int64": onnx.TensorProto.INT64, "bool": onnx.TensorProto.BOOL,
}


def closest(word: str, options: Iterable[str]) -> str | None:
    """The 'did you mean' hint for a misspelt word, or None when nothing is close."""
    found = close_matches(word, options)
    return f"did you mean {found[0]!r}?" if found else None


@dataclass(frozen=True)
class Key:
    """A key of a YAML mapping. `parse` turns its value into the rule's data, with the signature of its table
    (parser.py): file and rule keys `(yaml node, draft) -> None` filling the draft, constraint keys
    `(plain value, is_line) -> the Constraint field of the same name`, target keys `(yaml node, collector) ->
    value`. `schema` is its JSON-schema fragment (the description is `doc`); `example` a YAML snippet that
    parses: `key: value`, or `NAME: {key: value}` for a constraint or a target's key."""

    name: str
    parse: Callable[..., Any]
    schema: dict[str, Any]
    doc: str
    example: str
    required: bool = False
    # Run once the key has been parsed (or found absent), before the keys after it: checks that need this
    # key and the ones before it. Returns False when the rest of the rule cannot be checked.
    then: Callable[..., bool] | None = None

    def example_value(self) -> Any:
        """The value the example gives this key: `key: value`, or `NAME: {key: value}` (a constraint of NAME,
        the conditions of a target)."""
        data = yaml.safe_load(self.example)
        if self.name not in data:
            (data,) = data.values()
        return data[self.name]

    def json_schema(self) -> dict[str, Any]:
        return {**self.schema, "description": self.doc, "examples": [self.example_value()]}


@dataclass(frozen=True)
class Function:
    """A function of the compute language: `params` as in Python (`x, perm=None`, `*xs`), `example` an
    expression and `result` what it evaluates to (None: the example reads names of a rule)."""

    name: str
    impl: Callable[..., object]
    params: str
    doc: str
    example: str
    result: object = None

    @property
    def arity(self) -> tuple[int, int | None]:
        """(fewest, most) positional arguments; most is None for `*xs`."""
        names = [p.strip() for p in self.params.split(",") if p.strip()]
        if any(p.startswith("*") for p in names):
            return sum(1 for p in names if not p.startswith("*") and "=" not in p), None
        return sum(1 for p in names if "=" not in p), len(names)

    @property
    def signature(self) -> str:
        return f"{self.name}({self.params})"

    def impl_arity(self) -> tuple[int, int | None] | None:
        """The arity of the implementation, where Python can tell (numpy ufuncs: their input count)."""
        nin = getattr(self.impl, "nin", None)
        if isinstance(nin, int):
            return nin, nin
        try:
            sig = inspect.signature(self.impl)
        except (TypeError, ValueError):
            return None
        ps = list(sig.parameters.values())
        if any(p.kind is p.VAR_POSITIONAL for p in ps):
            return sum(1 for p in ps if p.kind is not p.VAR_POSITIONAL and p.default is p.empty), None
        return sum(1 for p in ps if p.default is p.empty), len(ps)


@dataclass(frozen=True)
class Field:
    """A field an expression reads with `name.field`: `on` says what it is read from."""

    name: str
    on: str
    doc: str
    example: str


E = TypeVar("E", Key, Function, Field)


@dataclass
class Table(Generic[E]):
    """An ordered table of entries: `name in table`, `table[name]`, iteration over the names (in table order,
    which for keys is also the order they are parsed in), and the messages for a word not in the table."""

    title: str
    doc: str
    entries: list[E]
    unknown: str = "unknown key {key!r}"  # formatted with key=, and what the caller passes
    missing: str = "missing {key!r}"
    fallback_hint: str | None = None  # when no entry is close: formatted with names=
    by_name: dict[str, E] = field(init=False)

    def __post_init__(self) -> None:
        self.by_name = {e.name: e for e in self.entries}
        assert len(self.by_name) == len(self.entries), f"duplicate entry in {self.title}"

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def __getitem__(self, name: str) -> E:
        return self.by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_name)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, name: str) -> E | None:
        return self.by_name.get(name)

    def names(self) -> list[str]:
        return list(self.by_name)

    def required(self) -> list[str]:
        return [e.name for e in self.entries if getattr(e, "required", False)]

    def unknown_error(self, key: str, **context: str) -> tuple[str, str | None]:
        """(message, hint) for a word that is not in the table."""
        hint = closest(key, self.by_name)
        if hint is None and self.fallback_hint is not None:
            hint = self.fallback_hint.format(names=", ".join(self.by_name))
        return self.unknown.format(key=key, **context), hint

    def missing_error(self, key: str) -> str:
        return self.missing.format(key=key)

    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema of a mapping whose keys are this table's (Key tables only)."""
        out: dict[str, Any] = {"type": "object", "description": self.doc,
                               "properties": {e.name: e.json_schema() for e in self.entries if isinstance(e, Key)}}
        if self.required():
            out["required"] = self.required()
        out["additionalProperties"] = False
        return out
