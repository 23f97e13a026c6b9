"""`onnxfuse cache show/clear`: the measured-decision cache."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from .app import cache_app


@cache_app.command("show")
def cache_show(as_json: Annotated[bool, typer.Option("--json", help="Print every decision as JSON.")] = False,
               ) -> None:
    """Where the decision cache is and what it holds (region decisions, whole-model confirmations). A file that
    is not a cache, or entries of the wrong shape, are named in one warning line on stderr (exit 0: optimize
    ignores them the same way)."""
    from ..select.decision_cache import DecisionCache

    summary = DecisionCache().summary()
    for w in summary["warnings"]:
        print(f"onnxfuse: warning: {w}", file=sys.stderr)
    if as_json:
        print(json.dumps({"schema": "onnxfuse.cache/1", **summary}, indent=2))
        return
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(summary["by_kind"].items())) or "empty"
    skipped = f", {summary['skipped']} malformed skipped" if summary["skipped"] else ""
    print(f"{summary['path']}: {summary['decisions']} decision(s) ({kinds}){skipped}, {summary['bytes']} bytes")
    for key, d in sorted(summary["entries"].items(), key=lambda kv: kv[1].get("when", "")):
        print("  " + _cache_line(key, d))


def _cache_line(key: str, d: dict) -> str:
    """One decision: date, kind, the model it was taken on, threads, rules, what was decided and how."""
    kind, rules = d.get("kind", "?"), ", ".join(d.get("rules", [])) or "-"
    model = d.get("model") or "(model not recorded)"
    threads = f"{d['threads']} thread(s)" if d.get("threads") is not None else "threads not recorded"

    def ratio(r) -> str:
        return f"ratio {r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]"

    if kind == "region":
        what = f"region {d.get('label', '?')}: " + (("kept" if d.get("keep") else "left as the original")
                                                   + (f", {ratio(d['ratio'])}" if d.get("ratio") else
                                                      f", budget ({d.get('budget', 0):g} s) ran out before it"))
    elif kind == "model":
        what = "whole-model confirmation: " + (ratio(d["ratio"]) if d.get("ratio") else
                                               d.get("why") or f"not reached within {d.get('budget', 0):g} s")
    elif kind == "selection":
        rep = d.get("report") or {}
        final = rep.get("final_ratio")
        what = (f"selection: {len(d.get('kept', []))} rewrite(s) kept, {len(d.get('dropped', []))} dropped; "
                f"confirmation {rep.get('confirmed') or 'not recorded'}"
                + (f", {ratio([final['median'], final['low'], final['high']])}" if final else ""))
    else:
        what = kind
    return f"{d.get('when', '?')}  {model}  {threads}  rules {rules}  {what}  ({key[:12]})"


@cache_app.command("clear")
def cache_clear() -> None:
    """Forget every measured decision (the next optimize times everything again)."""
    from ..select.decision_cache import DecisionCache

    cache = DecisionCache()
    n = cache.clear()
    print(f"{cache.path}: removed {n} decision(s)")
