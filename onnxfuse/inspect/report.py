"""Terminal tables for results (rich). JSON comes from Result.to_json()."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..inputs import InputPlan, fmt_bytes
from ..measure.clock import describe
from ..measure.stats import NOISE_PREFIX
from ..patterns.rules import Rule
from ..result import Result
from ..rewrite.engine import NearMiss
from ..targets import HOST
from ..words import count
from .op_profile import captured_share

NARROW = 100  # columns: below this, tables leave out their low-value columns (the rest fold, never cut)


class Grid:
    """A table as every report prints one: cells fold onto more lines instead of being cut with an ellipsis,
    and the `optional` columns are left out on a console narrower than NARROW. `row` takes every column's cell."""

    def __init__(self, console: Console, title: str | None, columns: tuple[str, ...] | list[str],
                 right: tuple[str, ...] | list[str] = (), optional: tuple[str, ...] = ()) -> None:
        self.keep = [c not in optional or console.width >= NARROW for c in columns]
        self.table = Table(title=title, title_justify="left")
        for c, k in zip(columns, self.keep, strict=True):
            if k:
                self.table.add_column(c, overflow="fold", justify="right" if c in right else "left",
                                      min_width=min(10, max(map(len, c.split()))))  # header words stay whole

    def row(self, *cells: str) -> None:
        self.table.add_row(*(c for c, k in zip(cells, self.keep, strict=True) if k))


def _delta(before: dict[str, int], after: dict[str, int]) -> list[tuple[str, int, int]]:
    ops = sorted(set(before) | set(after), key=lambda o: (after.get(o, 0) - before.get(o, 0), o))
    return [(o, before.get(o, 0), after.get(o, 0)) for o in ops if before.get(o, 0) != after.get(o, 0)]


def print_result(r: Result, console: Console) -> None:
    out = r.output or "(dry run: nothing written)"
    console.print(f"[bold]{r.input}[/bold] -> [bold]{out}[/bold]  target={r.target}")
    console.print(f"nodes {r.nodes_before} -> {r.nodes_after} ({r.nodes_after - r.nodes_before:+d}), "
                  f"{count(len(r.applications), 'rewrite')} in {count(r.sweeps, 'sweep')}, Transposes "
                  f"{r.ops_before.get('Transpose', 0)} -> {r.ops_after.get('Transpose', 0)}")
    for line in r.repairs:
        console.print(f"repaired on load: {escape(line)}")
    for line in r.load_notes:
        console.print(f"[dim]note on load: {escape(line)}[/dim]")
    if r.fired:
        t = Grid(console, "rules fired (the rewrites kept in the output)", ("rule", "count", "creates"),
                 right=("count",))
        created: dict[str, Counter] = {}
        for a in r.applications:
            created.setdefault(a.rule, Counter()).update(a.ops)
        for rule, n in sorted(r.fired.items(), key=lambda kv: (-kv[1], kv[0])):
            t.row(rule, str(n), ", ".join(f"{op}" for op in sorted(created[rule])))
        console.print(t.table)
    if r.cleanups:
        console.print("cleanups (exact steps, not rules; --no-fold turns them off): "
                      + ", ".join(f"{k} x{n}" for k, n in sorted(r.cleanups.items(), key=lambda kv: (-kv[1], kv[0]))))
    changes = _delta(r.ops_before, r.ops_after)
    if changes:
        t = Grid(console, "op counts that changed", ("op", "before", "after"), right=("before", "after"))
        for op, b, a in changes:
            t.row(op, str(b), str(a))
        console.print(t.table)
    if r.rolled_back:
        t = Grid(console, "rolled back (validation failed with them)", ("rule", "at value", "why"))
        for rb in r.rolled_back:
            t.row(rb.rule, rb.root, rb.reason)
        console.print(t.table)
    if r.skipped:
        console.print(f"[dim]{count(len(r.skipped), 'rule')} not used for target {r.target}: "
                      + "; ".join(f"{s.rule} ({s.reason})" for s in r.skipped[:6])
                      + (" ..." if len(r.skipped) > 6 else "") + "[/dim]")
    for name, weight, plan in r.profiles:
        label = "inputs" if len(r.profiles) == 1 else f"inputs ({name} profile, weight {weight:g})"
        console.print(f"{label}: {escape(plan.summary())}")
        for t in plan.tried:
            console.print(f"[dim]  did not run: {escape(t)}[/dim]")
    console.print(f"validation: {r.validation}")
    if r.checks:
        cols = ("output", "dtype", "shape", "max abs", "max rel", "cosine", "min tol", "tol", "ok")
        t = Grid(console, None, cols, right=cols[3:], optional=("cosine", "min tol"))
        for c in r.checks:
            t.row(c.name, c.dtype, "x".join(map(str, c.shape)) or "scalar", f"{c.max_abs:.2e}",
                  f"{c.max_rel:.2e}", f"{c.cosine:.6f}", f"{c.min_tolerance:.1e}",
                  f"{c.tolerance.rtol:g}/{c.tolerance.atol:g}",
                  ("[green]pass[/green]" if c.passed else "[red]FAIL[/red]")
                  + (f" ({c.decided_by})" if c.decided_by in ("atol", "rtol") else ""))
            if c.note:
                t.row("", f"[dim]{c.note}[/dim]", "", "", "", "", "", "", "")
        console.print(t.table)
        if any(c.decided_by in ("atol", "rtol") for c in r.checks):
            console.print("[dim]ok: each element must be within atol + rtol * |original| (tol is rtol/atol); "
                          "(atol) or (rtol): the larger term where an output came closest to its bound. Under "
                          "(atol), max rel can be large: it comes from values near zero[/dim]")
    if r.measure is not None:
        print_measure(r.measure, console)
    console.print("time: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in r.timings.items()))


def _versus(b) -> str:
    """'output vs input' (or 'B vs A'): the models' own labels, B first."""
    return f"{b.models[1].label} vs {b.models[0].label}" if len(b.models) > 1 else "B vs A"


def print_measure(m, console: Console) -> None:
    if m.note:
        console.print(f"measure: {m.note}")
        _print_final(m, console)
        return
    regions = m.strategy == "regions"
    cols = ["fused op group", "rules", "rewrites", *(["regions"] if regions else []),
            "region time saved" if regions else "latency saved", "with / without [95% CI]", "kept", "how"]
    clock = f", {describe(m.estimator)}" if m.estimator else ""
    t = Grid(console, f"measured on {m.provider}, {m.threads} thread(s){clock}, ORT_ENABLE_ALL, {m.rounds} round(s), "
             f"{m.strategy} selection", cols, right=("rewrites", "regions", "latency saved", "region time saved"),
             optional=("regions", "region time saved"))  # the saving is 1 - the ratio
    for alike in alike_groups(m.groups):
        g = alike[0]
        timed = [a for a in alike if a.effect is not None]
        gain = _span([a.gain * 100 for a in timed], "+.1f") + "%" if timed else ""
        effect = _span([a.effect.median for a in timed], ".3f") if len(timed) > 1 else str(g.effect or "")
        floors = _span([a.floor * 100 for a in alike], ".1f")
        # the decision's own words (select/decide.py why); a unit its measurement decided has none: its source
        how = escape(g.why) or {"timed": "timed", "cached": "[cyan]cached[/cyan]", "model": "whole model"}.get(
            g.source, g.source)
        if g.effect is not None and g.why:  # measured, not decided by it: the floor it did not clear
            how += f" (noise floor ±{floors}%)"
        if g.source == "undecided":
            how = f"[yellow]{how}[/yellow]; timed again next run"
        how += f" ({count(len(alike), 'class', 'classes')})" if len(alike) > 1 else ""
        t.row(g.group, ", ".join(g.rules), str(sum(a.rewrites for a in alike)),
              *([str(sum(a.instances for a in alike))] if regions else []), gain, effect,
              "[green]kept[/green]" if g.kept else "[red]dropped[/red]", how)
    console.print(t.table)
    if regions:
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in m.phases.items())
        clock = "thread CPU time" if m.estimator == "cpu" else "wall time"
        console.print(f"measure: {m.spent_s:.1f} s of a {m.budget_s:.0f} s budget on {clock}, {m.seconds:.1f} s of "
                      f"wall time ({phases})"
                      + (f"; {count(m.undecided, 'unit')} not timed: decided by their prior" if m.undecided
                         else "") + f"; whole-model confirmation: {m.confirmed or 'not needed'}")
    _print_final(m, console)
    _print_threads(m, console)


def alike_groups(groups: list) -> list[list]:
    """The measure table's rows: the groups (each a class of alike regions, decided once) that read the same but
    for their numbers (fused op group, rules, kept or dropped, and how it was decided) become one row: a detector's
    24 hard-swish Conv classes, one per feature-map size, are one row with their count."""
    rows: dict[tuple, list] = {}
    for g in groups:
        rows.setdefault((g.group, tuple(g.rules), g.kept, g.source, g.why), []).append(g)
    return list(rows.values())


def _span(values: list[float], fmt: str) -> str:
    """One value, or the range of several ('0.451..0.803')."""
    lo, hi = min(values), max(values)
    return format(lo, fmt) if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}..{hi:{fmt}}"


def _print_threads(m, console: Console) -> None:
    """Decisions hold for the thread count they were timed at: say so where it differs from onnxruntime's default."""
    from ..validate.runtime import physical_cores

    default = physical_cores()
    if m.provider == HOST and m.threads != default:
        console.print(f"[dim]measure: decided at {m.threads} thread(s); onnxruntime's default here uses {default} "
                      "(one per physical core): --threads auto measures at that[/dim]")


def _print_final(m, console: Console) -> None:
    """The whole-model confirmation: candidate / original, and per shape profile where there are several."""
    if m.final is not None:
        what = ("no rewrite group kept (the kept selection measured slower as a whole, or none made it faster; "
                "exact rewrites and folding, if any, stay)" if m.dropped_everything else "kept rewrites")
        whole = ("weighted total over the shape profiles (each profile counts by its weight, relative to the "
                 "original's time there)" if m.profiles else "whole model")
        word = m.final.final_word(m.floor)
        clock = f" on {describe(m.estimator)}" if m.estimator else ""
        console.print(f"measure: {what}; candidate / original latency at {m.threads} thread(s), {whole}{clock}: "
                      f"{m.final} -> {word}" + ("" if NOISE_PREFIX in word else
                                                f" (noise floor ±{m.floor:.1%}: two sessions of each model)")
                      + (f"; on wall time {m.final_wall}" if m.final_wall is not None and m.estimator != "wall"
                         else "")
                      + (f"; A/A contrast p10-p90 {m.aa_spread[0]:.3f}-{m.aa_spread[1]:.3f}" if m.aa_spread else ""))
        if m.profiles:
            console.print("measure: each profile alone (its own shapes), candidate / original: " + "; ".join(
                f"{name} (weight {w:g}) {r} -> {r.verdict_beyond(m.floor)}" for name, w, r in m.profiles))


def print_near_misses(misses: list[NearMiss], console: Console) -> None:
    """The near misses, closest first; `matched` is the nodes of the pattern the attempt matched."""
    if not misses:
        console.print("no near misses: every candidate either fused or failed at its first node")
        return
    t = Grid(console, f"near misses ({len(misses)}, closest first)", ("rule", "matched", "candidate", "failed at",
                                                                         "why"), right=("matched",))
    for m in misses:
        t.row(m.rule, f"{m.progress}/{m.size}" if m.size else str(m.progress), f"{m.op} {m.node}", m.at,
                  m.reason + (" (before the fusions ran)" if m.graph != "rewritten" else "")
              + (f" ({m.hidden})" if m.hidden else ""))
    console.print(t.table)


def print_rules(rules: list[Rule], console: Console) -> None:
    t = Grid(console, f"{len(rules)} rules", ("id", "size", "targets", "creates", "source"), right=("size",))
    for r in rules:
        creates = ", ".join(sorted({f"{d}.{o}" if d else o for d, o in r.output_ops()})) or "(alias)"
        t.row(r.id, str(r.size), ",".join(r.targets), creates,
              f"{'built-in ' if r.builtin else ''}{r.file.rsplit('/', 1)[-1]}:{r.span.line}")
    console.print(t.table)


def print_rule_usage(rules: list[Rule], target: str, console: Console) -> None:
    """`patterns list --target T`: for every rule, whether it is used on T and, where not (or not always), why."""
    from rich.markup import escape as esc

    from ..kernels.applicable import rule_usage
    from ..targets import kernel_source

    t = Grid(console, f"{len(rules)} rules on {target} (kernels: {kernel_source(target).label})",
             ("id", "used", "why", "creates"))
    for r in rules:
        u = rule_usage(r, target)
        creates = ", ".join(sorted({f"{d}.{o}" if d else o for d, o in r.output_ops()})) or "(alias)"
        t.row(r.id, u.used, esc(u.why), creates)
    console.print(t.table)


def print_bench(b, console: Console) -> None:
    for one in [b, *b.profiles]:
        _print_bench_profile(one, console, named=bool(b.profiles))


def _print_bench_profile(b, console: Console, named: bool) -> None:
    title = ((f"{b.profile} profile: " if named else "") + f"latency ({b.provider}, {b.threads} thread(s), level "
             f"{b.level}, inputs " + ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in b.inputs.items()) + ")")
    cols = ("model", "session ms", "first run ms", "median ms", "p90 ms", "p99 ms", "min ms", "spread", "runs")
    t = Grid(console, title, cols, right=cols[1:], optional=("first run ms", "p99 ms", "min ms"))
    for m in b.models:
        t.row(f"{m.label} {m.path}", f"{m.session_ms:.1f}", f"{m.first_run_ms:.3f}", f"{m.median_ms:.3f}",
              f"{m.p90_ms:.3f}", f"{m.p99_ms:.3f}", f"{m.min_ms:.3f}", f"{m.spread * 100:.1f}%", str(m.runs))
    console.print(t.table)
    if b.ratio is not None:
        console.print((f"{b.profile}: " if named else "") +
                      f"{_versus(b)}: {b.speedup:.3f}x speed (time ratio {b.ratio}, 95% CI, on "
                      f"{describe(b.estimator)}) -> [bold]{b.verdict}[/bold]" + (
                          "" if NOISE_PREFIX in (b.verdict or "") else
                          f" (noise floor ±{b.floor:.1%}: what a second session of each model differs by, on average)"))
    if b.batches:
        labels = [m.label for m in b.models]
        cols = ["batch"] + [f"{lab} ms" for lab in labels] + [f"{lab} samples/s" for lab in labels]
        t = Grid(console, "batch sweep", cols, right=cols)
        for p in b.batches:
            t.row(str(p.batch), *[f"{p.median_ms[lab]:.3f}" for lab in labels],
                  *[f"{p.throughput[lab]:.1f}" for lab in labels])
        console.print(t.table)


def print_profile(profiles, labels, console: Console, nodes: bool = False, comparison=None) -> None:
    ops = sorted({s.op for p in profiles for s in p.by_type},
                 key=lambda op: -max(s.total_us for p in profiles for s in p.by_type if s.op == op))
    heads = ("calls", "ms", "share", "mean us", "GFLOP/s", "GB/s")
    cols = ["op"] + [f"{lab} {h}" for lab in labels for h in heads]
    t = Grid(console, "op time by type (per run)", cols, right=cols[1:])
    for op in ops:
        row = [op]
        for p in profiles:
            s = next((s for s in p.by_type if s.op == op), None)
            row += ["", "", "", "", "", ""] if s is None else [
                f"{s.calls_per_run:.0f}", f"{s.total_us / 1e3:.3f}", f"{s.share * 100:.1f}%", f"{s.mean_us:.1f}",
                f"{s.gflops:.2f}", s.gbytes_text]
        t.row(*row)
    console.print(t.table)
    for p, lab in zip(profiles, labels, strict=True):
        if nodes:
            cols = ("node", "op", "calls", "mean us", "KB moved", "MFLOP", "replaces (onnxfuse)")
            nt = Grid(console, f"{lab}: slowest nodes", cols, right=cols[2:6])
            for s in p.by_node[:30]:
                nt.row(s.name, s.op, f"{s.calls_per_run:.0f}", f"{s.mean_us:.1f}", f"{s.bytes / 1e3:.1f}",
                       f"{s.flops / 1e6:.2f}", s.replaces)
            console.print(nt.table)
        console.print(f"{lab}: kernel times sum to {p.kernel_ms:.3f} ms = {p.agreement * 100:.0f}% of the measured "
                      f"latency {p.latency_ms:.3f} ms (profiled run {p.run_ms:.3f} ms); peaks on this machine "
                      f"{p.peaks.gflops:.1f} GFLOP/s (GEMM), {p.peaks.gbytes:.1f} GB/s (copy); the profiler's own "
                      f"{p.overhead_us:.1f} us per op call (calibrated) is subtracted")
        for s in p.signals:
            console.print(f"  - {s}")
        console.print(f"{lab}: {headroom_line(p)}", markup=False)
        console.print(f"  - {split_line(p)}", markup=False)
        for line in known_lines(p):
            console.print(f"  - {line}", markup=False)
    if len(profiles) == 2:
        if comparison is not None and comparison.ratio is not None:
            console.print(f"{labels[1]} vs {labels[0]}, interleaved with a second session of each (as bench and "
                          f"optimize time): time ratio {comparison.ratio} on {describe(comparison.estimator)} -> "
                          f"{comparison.verdict}", markup=False)
        share = captured_share(profiles[0], profiles[1])
        if share is not None:
            console.print(f"{labels[1]} {share_words(share, comparison.verdict if comparison else None)} the gap "
                          f"between {labels[0]} ({profiles[0].latency_ms:.3f} ms) and its GEMM-bound limit "
                          f"({profiles[0].gemm_bound_ms:.3f} ms)", markup=False)


def share_words(share: float, verdict: str | None = None) -> str:
    """How much of A's gap to its limit B removes; "slower" or "faster" only where the timing's verdict says so
    (a share from two medians alone is not a verdict)."""
    if verdict is not None and verdict not in ("faster", "slower"):
        return f"does not measurably change ({verdict}; medians: {share * 100:+.0f}% of)"
    return f"removes {share * 100:.0f}% of" if share >= 0 else f"is slower: it widens by {-share * 100:.0f}%"


def headroom_line(p) -> str:
    """The GEMM-bound limit, the headroom above it and the op types outside the GEMM class that take it."""
    top = ", ".join(f"{s.op} {s.total_us / 1e3:.3f} ms ({s.share * 100:.0f}%, {s.calls_per_run:.0f} calls)"
                    for s in p.remaining_costs())
    return (f"GEMM-bound limit {p.gemm_bound_ms:.3f} ms (Conv/MatMul/Gemm/attention work at "
            f"{p.peaks.gflops:.1f} GFLOP/s), headroom {p.headroom_ms:.3f} ms "
            f"({p.headroom_ms / p.latency_ms * 100 if p.latency_ms else 0:.0f}% of the latency); the most time "
            f"outside GEMM work: {top or 'none'}")


def split_line(p) -> str:
    """The headroom by what could remove it (ProfileResult.headroom_split)."""
    h = p.headroom_split()
    total = h.flop_memory_ms + h.flop_kernel_ms + h.other_ms + max(0.0, h.between_ms)

    def part(ms: float) -> str:
        return f"{ms:.3f} ms ({ms / total * 100 if total else 0:.0f}%)"

    between = f"; between kernels {part(h.between_ms)}" if h.between_ms > 0 else ""
    return (f"headroom by what could remove it: outside GEMM work {part(h.other_ms)} (fusion and layout); "
            f"FLOP ops' data at the copy peak {part(h.flop_memory_ms)} (their roofline: weights and maps they "
            f"read); FLOP ops' kernels above that roofline {part(h.flop_kernel_ms)} (onnxruntime's kernels at these "
            f"shapes){between}")


def known_lines(p) -> list[str]:
    """One line per remaining cost: what onnxfuse knows about that op type (remaining.py), where it was asked."""
    return [f"{s.op}: {p.known[s.op].text}" for s in p.remaining_costs() if s.op in p.known]


def print_inputs(plan: InputPlan, console: Console) -> None:
    """`onnxfuse inputs`: each input's dtype and shape, each dim's value, role and why, the tries that failed."""
    for name, arr in plan.feeds.items():
        console.print(f"{name}: {arr.dtype.name}[{'x'.join(map(str, arr.shape)) or 'scalar'}]", markup=False)
    for d in plan.dims:
        console.print(f"  {d.key} = {d.value} ({d.role}: {d.why})", markup=False)
    for t in plan.tried:
        console.print(f"  did not run: {t}", markup=False)
    console.print(f"estimated activations and inputs: {fmt_bytes(plan.estimate_bytes)} (memory budget "
                  f"{fmt_bytes(plan.budget_bytes)})", markup=False)
