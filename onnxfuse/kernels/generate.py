"""Build `ort_kernels.json` (the kernel table `--target` falls back on) from onnxruntime's
`docs/OperatorKernels.md`, the list of registered kernels onnxruntime generates for each release.

    python -m onnxfuse.kernels.generate OperatorKernels.md --commit SHA [--version V] [-o ort_kernels.json]

Kept: the providers of the targets whose facts are onnxruntime's registry (CPU, CUDA: targets.REGISTRY), the ONNX (`ai.onnx`, written "") and `com.microsoft` domains, and per kernel
its opset range and the tensor element types of each type constraint (sequence, optional, map and sparse types
are dropped: a fused op's element type is what `--target` checks). The Parameters column is not read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field

from ..targets import REGISTRY

# the providers of the registered targets whose facts are onnxruntime's registry (the others have their own file)
PROVIDERS = tuple(t.provider for t in REGISTRY.values() if t.facts == "registry")
DOMAINS = {"ai.onnx": "", "com.microsoft": "com.microsoft"}  # domain as written in the file -> as in a model
OPEN = None  # "13+": no upper bound

_SECTION = re.compile(r"^##\s+Operators implemented by\s+(\w+)")
_DOMAIN = re.compile(r"\*\*Operator Domain:\*\*\s*\*([^*]+)\*")
_RANGE = re.compile(r"^\[(\d+),\s*(\d+)\]$")
_SINCE = re.compile(r"^(\d+)\+$")
_ONE = re.compile(r"^(\d+)$")
_CONSTRAINT = re.compile(r"^\*\*([^*]+)\*\*\s*=\s*(.*)$")
_TENSOR = re.compile(r"^tensor\((\w+)\)$")


class TableError(ValueError):
    pass


@dataclass
class Kernel:
    since: int
    until: int | None  # inclusive; None: every later opset
    types: dict[str, list[str]] = field(default_factory=dict)  # constraint -> element types ("float", ...)

    def to_json(self) -> list:
        return [self.since, self.until, self.types]


def parse_versions(cell: str) -> tuple[int, int | None]:
    """'13+' -> (13, None); '13' -> (13, 13); '[6, 12]' -> (6, 12)."""
    s = cell.strip()
    if m := _SINCE.match(s):
        return int(m.group(1)), OPEN
    if m := _ONE.match(s):
        return int(m.group(1)), int(m.group(1))
    if m := _RANGE.match(s):
        return int(m.group(1)), int(m.group(2))
    raise TableError(f"not an opset version: {cell!r}")


def parse_types(cell: str) -> dict[str, list[str]]:
    """'**T** = tensor(float), seq(tensor(float))<br/> **T1** = tensor(int64)' -> {'T': ['float'], 'T1': ['int64']}
    (tensor element types only, sorted)."""
    out: dict[str, list[str]] = {}
    for part in re.split(r"<br\s*/?>", cell):
        part = part.strip()
        if not part:
            continue
        m = _CONSTRAINT.match(part)
        if m is None:
            raise TableError(f"not a type constraint: {part!r}")
        elems = [t.group(1) for item in m.group(2).split(", ") if (t := _TENSOR.match(item.strip()))]
        out[m.group(1).strip()] = sorted(set(elems))
    return out


def parse(text: str, providers: tuple[str, ...] = PROVIDERS, domains: dict[str, str] | None = None
          ) -> dict[str, dict[str, dict[str, list[Kernel]]]]:
    """provider -> domain -> op -> kernels (in the file's order), for the providers and domains asked for."""
    domains = DOMAINS if domains is None else domains
    table: dict[str, dict[str, dict[str, list[Kernel]]]] = {}
    provider: str | None = None
    domain: str | None = None
    op: str | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if m := _SECTION.match(line):
            provider = m.group(1) if m.group(1) in providers else None
            domain = op = None
            if provider:
                table.setdefault(provider, {})
            continue
        if provider is None or not line.startswith("|"):
            continue
        if m := _DOMAIN.search(line):
            domain = domains.get(m.group(1).strip())
            op = None
            continue
        cells = [c.strip() for c in line[1:-1 if line.endswith("|") else None].split("|")]
        if len(cells) < 4 or cells[0] == "Op Name" or set(cells[0]) <= {"-"} and cells[0]:
            continue  # header, separator, or the "| |" rows between domains
        if domain is None:
            continue
        if cells[0]:
            op = cells[0]
        if op is None:
            raise TableError(f"line {lineno}: a continuation row before any op")
        try:
            since, until = parse_versions(cells[2])
            types = parse_types(cells[3])
        except TableError as e:
            raise TableError(f"line {lineno}: {e}") from None
        table[provider].setdefault(domain, {}).setdefault(op, []).append(Kernel(since, until, types))
    missing = [p for p in providers if p not in table]
    if missing:
        raise TableError(f"no section for {', '.join(missing)} (expected '## Operators implemented by ...')")
    return table


def to_json_text(table: dict[str, dict[str, dict[str, list[Kernel]]]], source: dict[str, str]) -> str:
    """Stable, diffable JSON: one line per op."""
    lines = ["{", f' "source": {json.dumps(source, sort_keys=True)},',
             ' "format": "provider -> domain -> op -> [[since, until (null: open), {constraint: [element types]}]]",',
             ' "kernels": {']
    provs = sorted(table)
    for pi, prov in enumerate(provs):
        lines.append(f"  {json.dumps(prov)}: {{")
        doms = sorted(table[prov])
        for di, dom in enumerate(doms):
            lines.append(f"   {json.dumps(dom)}: {{")
            ops = sorted(table[prov][dom])
            for oi, name in enumerate(ops):
                ks = json.dumps([k.to_json() for k in table[prov][dom][name]], separators=(",", ":"))
                lines.append(f"    {json.dumps(name)}: {ks}" + ("," if oi < len(ops) - 1 else ""))
            lines.append("   }" + ("," if di < len(doms) - 1 else ""))
        lines.append("  }" + ("," if pi < len(provs) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m onnxfuse.kernels.generate", description=__doc__.split("\n\n")[0])
    ap.add_argument("markdown", help="a local copy of onnxruntime's docs/OperatorKernels.md")
    ap.add_argument("--commit", required=True, help="the onnxruntime commit the file was taken from")
    ap.add_argument("--version", default="", help="the onnxruntime release that commit belongs to, if known")
    ap.add_argument("--note", default="", help="anything else a reader of the table should know")
    ap.add_argument("-o", "--output", default="-", help="output file (default: stdout)")
    args = ap.parse_args(argv)
    with open(args.markdown, encoding="utf-8") as f:
        text = f.read()
    try:
        table = parse(text)
    except TableError as e:
        print(f"{args.markdown}: {e}", file=sys.stderr)
        return 1
    source = {"repo": "microsoft/onnxruntime", "file": "docs/OperatorKernels.md", "commit": args.commit,
              "onnxruntime": args.version}
    if args.note:
        source["note"] = args.note
    out = to_json_text(table, source)
    if args.output == "-":
        sys.stdout.write(out)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
