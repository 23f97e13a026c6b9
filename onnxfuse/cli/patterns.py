"""`onnxfuse explain` and `onnxfuse patterns list/show/check/test/schema`: the rules, why they fire or not."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer

from ..errors import OnnxfuseError
from ..targets import HOST
from .app import PatternsOpt, TargetOpt, app, out, parse_target, patterns_app


@app.command()
def explain(
    model: Annotated[str, typer.Argument(help="Model to inspect.")],
    rule: Annotated[str | None, typer.Option("--rule", "-r", help="Only this rule (shows every attempt).")] = None,
    patterns: PatternsOpt = None,
    target: TargetOpt = HOST,
    as_json: Annotated[bool, typer.Option("--json", help="Print the explanation as JSON (every near miss, "
                                          "with `hidden` saying why a row is left out by default).")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="Also the near misses of rules that cannot apply on "
                                           "this model and target (outside their opset range, not declared for "
                                           "the target, no kernel).")] = False,
    details: Annotated[bool, typer.Option("--details", "-v", help="Print the near misses as a table, every "
                                          "one, with the node each failed at.")] = False,
) -> None:
    """Why fusions did not happen: the near misses of the rules that can apply here, closest first, with the
    node and constraint that failed."""
    from .. import explain as run_explain

    ex = run_explain(model, patterns or [], parse_target(target), rule)
    if as_json:
        print(json.dumps(ex.to_json(), indent=2))
        return
    from ..inspect.report import print_near_misses
    from ..words import count

    skipped = [s for s in ex.skipped if rule is None or s.rule == rule]
    shown = ex.near_misses if show_all or rule is not None else [m for m in ex.near_misses if not m.hidden]
    if not details:
        from ..inspect.summary import explain_summary

        for line in explain_summary(ex, shown, skipped, target, out.width, every=show_all or rule is not None):
            out.print(line, markup=False, soft_wrap=True)
        return
    if ex.fired:
        out.print("would fire (rewriting alone, before validation and measured selection; optimize reports what "
                  "it keeps): " + ", ".join(f"{k} x{v}" for k, v in sorted(ex.fired.items())))
    if show_all or rule is not None:
        for s in skipped:
            out.print(f"[dim]rule {s.rule} not used for {target}: {s.reason}[/dim]")
    elif skipped:
        hidden = len(ex.near_misses) - len(shown)
        out.print(f"[dim]{count(len(skipped), 'rule')} cannot apply on this model and {target} (outside their "
                  f"opset range, not declared for {target}, or no kernel)" + (
                      f"; {count(hidden, 'near miss', 'near misses')} of theirs hidden" if hidden else "")
                  + ": --all shows them and why[/dim]")
    print_near_misses(shown, out)
    if ex.misaligned:
        worst = sorted(ex.misaligned, key=lambda m: -m.waste)
        out.print(f"alignment: {len(worst)} conv/matmul dims are not a multiple of {ex.vector_width} (fp32 lanes on "
                  f"{target}); lanes idle on them: " + ", ".join(
                      f"{m.node} {m.dim} {m.value} ({m.waste * 100:.0f}%)" for m in worst[:8])
                  + (" ..." if len(worst) > 8 else ""))




@patterns_app.command("list")
def patterns_list(patterns: PatternsOpt = None,
                  no_builtin: Annotated[bool, typer.Option("--no-builtin", help="Only the --patterns files.")]
                  = False,
                  target: Annotated[str | None, typer.Option("--target", "-t", help="Say for each rule whether it "
                                                             "is used on this target, and why not.")]
                  = None) -> None:
    """All rules, in the order they are tried (bigger matches first)."""
    from .. import load_rules, rules_in_order
    from ..inspect.report import print_rule_usage, print_rules

    rules = rules_in_order(load_rules(patterns or [], not no_builtin))
    if target is None:
        print_rules(rules, out)
    else:
        print_rule_usage(rules, parse_target(target), out)


@patterns_app.command("show")
def patterns_show(rule_id: Annotated[str, typer.Argument(help="Rule id.")], patterns: PatternsOpt = None) -> None:
    """Print one rule's source text and where it comes from."""
    from .. import load_rules

    rules = {r.id: r for r in load_rules(patterns or [])}
    if rule_id not in rules:
        from ..rewrite.fold import CLEANUP_STEPS

        if rule_id in CLEANUP_STEPS:
            raise OnnxfuseError(f"{rule_id!r} is an exact cleanup step, not a rule",
                                hint="docs/commands.md lists the cleanup steps; --no-fold turns them off")
        raise OnnxfuseError(f"no rule with id {rule_id!r}", hint="see `onnxfuse patterns list`")
    r = rules[rule_id]
    out.print(f"# {r.file}:{r.span.line}  size={r.size} targets={','.join(r.targets)}")
    print(_rule_source(r.file, r.span.line))


def _rule_source(path: str, line: int) -> str:
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = line - 1
    while start > 0 and not lines[start].lstrip().startswith("- id:"):
        start -= 1
    end = start + 1
    while end < len(lines) and not lines[end].lstrip().startswith("- id:"):
        end += 1
    return "\n".join(lines[start:end]).rstrip()


@patterns_app.command("check")
def patterns_check(files: Annotated[list[str], typer.Argument(help="Pattern files or folders.")]) -> None:
    """Validate pattern files; print every problem as file:line:col: error: ..., and as warnings the rules that
    can never be used (no kernel on any of their targets), whose id is a built-in rule's, or that a built-in rule
    takes the nodes of on their own example (it fires first)."""
    from .. import PatternError, load_rules
    from ..inspect.selftest import shadowed_by
    from ..rewrite.ruleset import rule_warnings
    from ..words import count

    problems = 0
    for f in files:
        if not os.path.exists(f):
            raise OnnxfuseError(f"{f}: no such pattern file or folder")
        try:
            rules = load_rules([f], builtin=False)
            warnings = rule_warnings(rules)
            try:  # as optimize --patterns F loads them: the built-ins, then the file's
                loaded = load_rules([f])
            except OnnxfuseError:  # an id a built-in has (warned above; a built-in file itself): no run has both
                loaded = []
            warnings += [w for r in loaded if not r.builtin and (w := shadowed_by(r, loaded)) is not None]
            for w in warnings:
                print(w, file=sys.stderr)
            out.print(f"{f}: {count(len(rules), 'rule')}, {count(len(warnings), 'warning')}" if warnings else
                      f"{f}: ok ({count(len(rules), 'rule')})")
        except PatternError as e:
            diags = getattr(e, "diagnostics", None) or [e.message]
            for d in diags:
                print(str(d), file=sys.stderr)
            problems += len(diags)
    if problems:
        raise typer.Exit(1)


@patterns_app.command("test")
def patterns_test(files: Annotated[list[str] | None, typer.Argument(help="Pattern files (default: built-in).")]
                  = None, rule: Annotated[str | None, typer.Option("--rule", "-r", help="Only this rule id.")] = None
                  ) -> None:
    """Self-test rules: build a model per alternative and operand order, check the rule fires once with equal
    onnxruntime outputs, and that mutants (constant off, extra consumer, wrong dtype) do not fire."""
    from .. import load_rules, self_test

    rules = load_rules(files or [], builtin=not files)
    if rule:
        rules = [r for r in rules if r.id == rule]
        if not rules:
            raise OnnxfuseError(f"no rule with id {rule!r}")
    from rich.markup import escape

    from ..words import count

    colour = {"ok": "green", "FAIL": "red"}
    counts: dict[str, int] = {}
    for report in self_test(rules):
        status = report.status
        counts[status] = counts.get(status, 0) + 1
        out.print(f"[{colour.get(status, 'yellow')}]{status}[/] {report.rule}: {escape(report.summary)}")
        for problem in report.problems:
            out.print(f"    {escape(problem)}")
    out.print(f"{count(len(rules), 'rule')}: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("ok", "not validated here",
                                                                                        "skipped", "FAIL")
                                                                                if s != "skipped" or s in counts))
    if counts.get("FAIL"):
        raise typer.Exit(1)


@patterns_app.command("schema")
def patterns_schema() -> None:
    """Print the JSON Schema of pattern files (for editor completion)."""
    from .. import pattern_schema

    sys.stdout.write(pattern_schema())
