"""The first screen: what a command found, in a few lines that fit the terminal, the answer first. The tables
behind it are `--details` (report.py); `--json` has everything.

Every line is fitted to the width: a list ends with "+N more" where the rest would not fit, and only a line
with no list to shorten is cut, with "...". A line never wraps."""

from __future__ import annotations

from collections import Counter

from ..measure.stats import NOISE_PREFIX
from ..result import Result
from ..words import count

__all__ = ["bench_summary", "explain_summary", "fit", "fit_list", "more", "optimize_summary", "profile_summary", "short_path", "validation_word"]

ELLIPSIS = "..."


def fit(line: str, width: int) -> str:
    """`line` cut to `width` columns, ending in "..." where it was cut."""
    return line if len(line) <= width else line[: max(0, width - len(ELLIPSIS))].rstrip() + ELLIPSIS


def fit_list(head: str, items: list[str], width: int, tail: str = "") -> str:
    """`head` + the items joined by ", " + `tail`, with as many items as fit and "+N more" for the rest."""
    for k in range(len(items), -1, -1):
        rest = len(items) - k
        shown = items[:k] + ([f"+{rest} more"] if rest else [])
        line = head + ", ".join(shown) + tail
        if len(line) <= width:
            return line
    return fit(head + ", ".join(items) + tail, width)


def short_path(path: str, width: int) -> str:
    """A path that fits `width`, its middle left out (the file name is what tells models apart)."""
    if len(path) <= width:
        return path
    keep = max(8, width - len(ELLIPSIS))
    return path[: keep // 3] + ELLIPSIS + path[-(keep - keep // 3):]


def validation_word(status: str, short: bool = False) -> str:
    """The validation status (Result.validation) in a word or two."""
    if status.startswith("passed"):
        return "validated"
    if status.startswith("skipped"):
        return "not validated" + ("" if short else " (--no-validate)")
    if status.startswith("not needed"):
        return "nothing rewritten"
    return "not validated" if short else f"validation {status}"


def short_word(word: str) -> str:
    """A verdict (measure/stats.py judge) in a few words: "within the noise floor (±1.0%): not counted as
    faster" is "within noise (±1.0%)"."""
    if word.startswith(NOISE_PREFIX):
        return "within noise " + word[len(NOISE_PREFIX):].split(":")[0].strip()
    return word


def _verdict(r: Result) -> str:
    """The answer: how the output's time compares with the input's, and whether it is validated."""
    valid = validation_word(r.validation)
    m = r.measure
    if m is None and not r.applications:
        return f"nothing rewritten: the output is the input; {valid}"
    if m is None:
        return f"not measured (--no-measure): every validated rewrite kept; {valid}"
    if m.final is None:
        return f"not timed ({m.note or m.confirmed or 'nothing to time'}); {valid}"
    if m.dropped_everything and not r.applications:  # the timing compared the input with itself: noise
        return f"no faster selection found: the output is the input; {valid}"
    if m.dropped_everything:
        return f"no faster selection found: exact rewrites only, {m.final.median:.3f}x the input's time; {valid}"
    return (f"{short_word(m.final.final_word(m.floor))}: {m.final.median:.3f}x the input's time "
            f"[{m.final.low:.3f}, {m.final.high:.3f}]; {valid}")


def _kept(r: Result, width: int) -> str:
    """Nodes before and after, and the rules kept, most rewrites first."""
    fired = sorted(r.fired.items(), key=lambda kv: (-kv[1], kv[0]))
    head = f"nodes {r.nodes_before} -> {r.nodes_after}; "
    if not fired:
        return head + ("no rule kept" + (f" (cleanups: {sum(r.cleanups.values())} exact steps)" if r.cleanups
                                        else ""))
    return fit_list(head + f"kept {count(sum(r.fired.values()), 'rewrite')}: ",
                    [f"{rule} x{n}" if n > 1 else rule for rule, n in fired], width)


def _left(r: Result, width: int) -> list[str]:
    """What was found and not kept: groups measured no faster, rewrites validation rolled back."""
    lines: list[str] = []
    m = r.measure
    if m is not None:
        dropped = [g for g in m.groups if not g.kept]
        rules = Counter(rule for g in dropped for rule in g.rules if rule in m.dropped_rules)
        if dropped:
            lines.append(fit_list(f"left out {count(len(dropped), 'group')} measured no faster: ",
                                  [rule for rule, _ in rules.most_common()], width))
    if r.rolled_back:
        rules = Counter(rb.rule for rb in r.rolled_back)
        lines.append(fit_list(f"rolled back {count(len(r.rolled_back), 'rewrite')} validation rejected: ",
                              [f"{rule} x{n}" if n > 1 else rule for rule, n in rules.most_common()], width))
    return lines


def _spent(r: Result) -> str:
    """Where the time went, and the measurement's budget."""
    total = sum(r.timings.values())
    m = r.measure
    if m is None or not m.budget_s:
        return f"took {total:.1f} s"
    at = f"at {count(m.threads, 'thread')} on {m.provider}"
    if m.groups and all(g.source == "cached" for g in m.groups):
        return f"took {total:.1f} s; decided {at} by the decision cache (--no-cache times again)"
    clock = "CPU" if m.estimator == "cpu" else "wall"
    return f"took {total:.1f} s; measured {at}: {m.spent_s:.1f} s of a {m.budget_s:.0f} s budget ({clock} time)"


def more(width: int, options: str, command: str = "") -> str:
    """Where to look next: the options, and a command (on the model itself where that fits)."""
    line = f"more: {options}" + (f", {command}" if command else "")
    if len(line) > width and command:
        line = f"more: {options}, {' '.join(command.split()[:-1])} IN"
    return fit(line, width)


def optimize_summary(r: Result, width: int, command: str = "onnxfuse explain IN") -> list[str]:
    """`onnxfuse optimize`'s first screen: where the output went, the verdict, what was kept and left out, the
    time taken, and where to look next. At most 8 lines, none wider than `width`."""
    where = (f"wrote {short_path(r.output, width - 6)}" if r.output else "dry run: nothing written")
    lines = [where, fit(_verdict(r), width), _kept(r, width), *_left(r, width)]
    if r.repairs:
        lines.append(fit(f"repaired on load: {count(len(r.repairs), 'defect')} (--details says which)", width))
    lines.append(fit(_spent(r), width))
    lines.append(more(width, "--details (the tables), --json, --html FILE", command))
    return lines


def bench_summary(b, width: int) -> list[str]:
    """`onnxfuse bench`'s first screen (and `optimize --bench`'s last lines): the verdict of B against A per
    shape profile, then each model's median, p90 and runs."""
    lines: list[str] = []
    for one in [b, *b.profiles]:
        named = f"{one.profile}: " if b.profiles else ""
        if one.ratio is not None:
            first, second = one.models[0], one.models[1]
            lines.append(fit(f"{named}{short_word(one.verdict or '')}: {second.label} runs in {one.ratio.median:.3f}x {first.label}'s "
                             f"time [{one.ratio.low:.3f}, {one.ratio.high:.3f}] ({count(one.threads, 'thread')}, "
                             f"{one.provider})", width))
        for m in one.models:
            numbers = f": median {m.median_ms:.3f} ms, p90 {m.p90_ms:.3f} ms, {m.runs} runs"
            lines.append(f"  {named}{m.label} {short_path(m.path, width - len(numbers) - len(named) - 4)}{numbers}")
    return [fit(line, width) for line in lines]


NEAR_MISSES_SHOWN = 5  # explain's first screen: the closest near misses, two lines each (--details: all)


def explain_summary(ex, shown: list, skipped: list, target: str, width: int, every: bool = False) -> list[str]:
    """`onnxfuse explain`'s first screen: what would fire, the closest near misses, where and why (all of them
    where `every`: --rule, --all), how many rules cannot apply here."""
    fired = sorted(ex.fired.items(), key=lambda kv: (-kv[1], kv[0]))
    lines = [fit_list("would fire: ", [f"{k} x{v}" for k, v in fired], width) if fired else "would fire: nothing"]
    if shown:
        listed = shown if every else shown[:NEAR_MISSES_SHOWN]
        lines.append(f"near misses: {len(shown)}, closest first" + (
            f" (the first {len(listed)}; --details lists all)" if len(listed) < len(shown) else ""))
        for m in listed:
            matched = f"{m.progress}/{m.size}" if m.size else str(m.progress)
            lines.append(fit(f"  {m.rule} ({matched} matched) at {m.at or m.node}", width))
            lines.append(fit(f"    {m.reason}", width))
    else:
        lines.append("near misses: none (every candidate either fused or failed at its first node)")
    if skipped and not every:
        lines.append(fit(f"{count(len(skipped), 'rule')} cannot apply on this model and {target}: --all shows "
                         "them and why", width))
    if ex.misaligned:
        lines.append(fit(f"alignment: {count(len(ex.misaligned), 'conv/matmul dim')} not a multiple of "
                         f"{ex.vector_width} (--details names them)", width))
    lines.append(more(width, "--details (the near-miss table), --rule ID, --json"))
    return lines


def profile_summary(profiles: list, labels: list[str], width: int, comparison=None) -> list[str]:
    """`onnxfuse profile`'s first screen: per model its latency, GEMM-bound limit and headroom, where the time
    goes and what outside GEMM work takes it; with two models, B against A."""
    lines: list[str] = []
    for p, lab in zip(profiles, labels, strict=True):
        share = p.headroom_ms / p.latency_ms * 100 if p.latency_ms else 0.0
        lines.append(f"{lab} {short_path(p.path, max(12, width - len(lab) - 1))}")
        lines.append(fit(f"  {p.latency_ms:.3f} ms a run; GEMM-bound limit {p.gemm_bound_ms:.3f} ms; headroom "
                         f"{p.headroom_ms:.3f} ms ({share:.0f}%)", width))
        lines.append(fit_list("  most time: ", [f"{s.op} {s.share * 100:.0f}%" for s in p.by_type], width))
        rest = p.remaining_costs()
        if rest:
            lines.append(fit_list("  outside GEMM work: ", [f"{s.op} {s.total_us / 1e3:.3f} ms" for s in rest],
                                  width))
    if comparison is not None and comparison.ratio is not None:
        r = comparison.ratio
        lines.insert(0, fit(f"{short_word(comparison.verdict or '')}: {labels[1]} runs in {r.median:.3f}x {labels[0]}'s time "
                            f"[{r.low:.3f}, {r.high:.3f}]", width))
    lines.append(more(width, "--details (the op table, signals), --nodes, --json, --html FILE"))
    return lines
