"""The rules a run uses: the built-in pattern files, then the user's, filtered by --only/--skip."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from ..errors import OnnxfuseError
from ..kernels.applicable import rule_issue
from ..patterns.parser import load_path, parse_text
from ..patterns.rules import Rule
from ..patterns.spec import json_schema_text
from ..patterns.syntax import Call, Ref
from .engine import MAX_SWEEPS
from .fold import CLEANUP_STEPS

__all__ = ["RulesArg", "builtin_patterns_dir", "chosen_rules", "load_rules", "pattern_schema", "rules_from_yaml"]

# what the library calls (rewrite_model, FusionPass) take as `rules`: None (the built-in rules), or Rule objects
# and pattern file or folder paths (one alone, or a list of them mixed)
RulesArg = Rule | str | os.PathLike | Iterable[Rule | str | os.PathLike] | None


def builtin_patterns_dir() -> str:
    """The repo's patterns/ in a source checkout; the wheel's onnxfuse.builtin_patterns when installed."""
    here = Path(__file__).resolve().parents[1]  # onnxfuse/
    if (here.parent / "pyproject.toml").is_file() and (here.parent / "patterns").is_dir():
        return str(here.parent / "patterns")
    return str(resources.files("onnxfuse.builtin_patterns"))


def load_rules(patterns: list[str] | None = None, builtin: bool = True, only: list[str] | None = None,
               skip: list[str] | None = None) -> list[Rule]:
    """Built-in rules (unless builtin=False), then the pattern files or folders given, in order; `only` and
    `skip` filter by rule id. Bad files raise PatternError (file:line:col)."""
    rules: list[Rule] = []
    if builtin:
        rules.extend(load_path(builtin_patterns_dir(), builtin=True))
    for p in patterns or []:
        if not os.path.exists(p):
            raise OnnxfuseError(f"{p}: no such pattern file or folder")
        rules.extend(load_path(p, order_base=len(rules)))
    ids = {r.id for r in rules}
    seen: dict[str, Rule] = {}
    for r in rules:
        _not_a_cleanup_step(r)
        if r.id in seen:
            first = seen[r.id]
            raise OnnxfuseError(f"{r.span}: error: rule id {r.id!r} is already defined at {first.span}"
                                + (" (a built-in rule)" if first.builtin else ""), hint=_collision_hint(r.id, first))
        seen[r.id] = r
    for option, names in (("only", only), ("skip", skip)):
        for n in names or []:
            if n in CLEANUP_STEPS:
                raise OnnxfuseError(f"{n!r} is an exact cleanup step, not a rule", option=option, value=n,
                                    hint="turning folding off (--no-fold, fold=False) turns off every cleanup step "
                                    "(constant folding, If inlining, merging); see docs/commands.md")
            if n not in ids:
                raise OnnxfuseError("no rule with that id", hint="see `onnxfuse patterns list`", option=option,
                                    value=n)
    if only:
        rules = [r for r in rules if r.id in only]
    if skip:
        rules = [r for r in rules if r.id not in skip]
    return rules


def rules_from_yaml(text: str, name: str = "<yaml>") -> list[Rule]:
    """The rules of a pattern file given as text (the YAML of patterns/*.yaml, docs/patterns.md): rules made in
    Python, e.g. `onnxfuse.load_rules() + onnxfuse.rules_from_yaml(text)`. A bad rule raises PatternError at
    `name`:line:col."""
    if not isinstance(text, str):
        raise OnnxfuseError(f"expected the YAML text of a pattern file, got {type(text).__name__}", option="text")
    rules = parse_text(text, name)
    for r in rules:
        _not_a_cleanup_step(r)
    return rules


def chosen_rules(rules: RulesArg) -> list[Rule]:
    """The rules a library call applies, exactly: None is every built-in rule (load_rules(); those that do not apply
    to the target are skipped by the engine); otherwise each item is a Rule (from load_rules or rules_from_yaml,
    filtered as you like) or a pattern file or folder, which adds its own rules only (list builtin_patterns_dir()
    too for the built-in ones). The list's order is the file order the engine breaks ties by."""
    if rules is None:
        return load_rules()
    items = [rules] if isinstance(rules, Rule | str | os.PathLike) else rules
    if not isinstance(items, Iterable):
        raise OnnxfuseError(f"expected Rule objects or pattern file paths, not {type(rules).__name__}",
                            option="rules", value=rules)
    out: list[Rule] = []
    for item in items:
        if isinstance(item, Rule):
            out.append(item)
        elif isinstance(item, str | os.PathLike):
            out.extend(load_rules([os.fspath(item)], builtin=False))
        else:
            raise OnnxfuseError(f"expected a Rule or a pattern file path, not {type(item).__name__}",
                                option="rules", value=item)
    seen: dict[str, Rule] = {}
    for r in out:
        _not_a_cleanup_step(r)
        if r.id in seen:
            raise OnnxfuseError(f"{r.span}: error: rule id {r.id!r} is given twice (also at {seen[r.id].span})",
                                hint="rule ids are global: leave one of them out, or rename one")
        seen[r.id] = r
    return [r if r.order == i else dataclasses.replace(r, order=i) for i, r in enumerate(out)]


def _not_a_cleanup_step(r: Rule) -> None:
    if r.id in CLEANUP_STEPS:
        raise OnnxfuseError(f"{r.span}: error: rule id {r.id!r} is the name of an internal step",
                            hint="rename the rule")


def _collision_hint(rule_id: str, first: Rule) -> str:
    if first.builtin:
        return (f"rule ids are global: rename yours (e.g. 'my-{rule_id}'), or pass --no-builtin to use only your "
                f"pattern files (--skip {rule_id} would drop both rules)")
    return "rule ids are global: rename one of them"


def rule_warnings(rules: list[Rule]) -> list[str]:
    """What makes a user's rule useless although its file is valid, one `file:line:col: warning: ...` line per
    problem: its output ops have a kernel on none of its targets (from targets.py: the installed onnxruntime's
    registry, else the published kernel table), or its id is a built-in rule's (optimize refuses the pair)."""
    builtin = {r.id: r for r in load_path(builtin_patterns_dir(), builtin=True)}
    out: list[str] = []
    for r in rules:
        issues = {t: rule_issue(r, t, None) for t in r.targets}
        if all(issues.values()):
            why = "; ".join(f"{t}: {issue}" for t, issue in issues.items())
            out.append(f"{r.span}: warning: rule {r.id!r} can never be used on its targets ({why}) "
                       "(hint: target a provider that has the kernel, or emit another op; see "
                       f"`onnxfuse patterns list --target cuda`)")
        if rewrites_into_itself(r):
            out.append(f"{r.span}: warning: rule {r.id!r} rewrites its match into the same nodes: it fires again on "
                       f"its own output every sweep, until the limit of {MAX_SWEEPS} sweeps (hint: rewrite into "
                       "something else, or delete the rule)")
        same = r.id in builtin and (os.path.realpath(r.span.file), r.span.line) == (
            os.path.realpath(builtin[r.id].span.file), builtin[r.id].span.line)  # checking the built-in files
        if not r.builtin and r.id in builtin and not same:
            out.append(f"{r.span}: warning: rule id {r.id!r} is also a built-in rule's ({builtin[r.id].span}): "
                       f"optimize refuses the pair (hint: {_collision_hint(r.id, builtin[r.id])})")
    return out


def rewrites_into_itself(rule: Rule) -> bool:
    """The rewrite is the match again, line for line (same names, ops and operands; no attributes on either side):
    a rule that always matches its own output. Rules with attributes or alternatives are not compared."""
    nodes = rule.rewrite
    if len(nodes) != len(rule.lines) or any(
            n.call is None or len(n.outputs) != 1 or n.attrs or n.copy_attrs is not None for n in nodes):
        return False
    match = {name: _plain(e) for name, e in rule.lines.items()}
    return all(match.get(n.outputs[0]) is not None and match.get(n.outputs[0]) == _plain(n.call) for n in nodes)


def _plain(e) -> tuple | None:
    """An expression without its offsets; None where it holds attributes or alternatives."""
    if isinstance(e, Ref):
        return ("ref", e.name, e.optional)
    if isinstance(e, Call) and not e.kwargs:
        args = [_plain(a) for a in e.args]
        return None if any(a is None for a in args) else ("call", e.domain, e.op, tuple(args))
    return None


def pattern_schema() -> str:
    """The JSON Schema of pattern files (for editor completion), as text."""
    return json_schema_text()
