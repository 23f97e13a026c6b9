"""One self-contained HTML page (inline CSS and SVG, no network): latency before/after, op-time breakdown
before/after, the fusion list, the validation table, memory-bound signals and the batch sweep."""

from __future__ import annotations

import datetime as _dt
import html
from collections import Counter

from ..measure.clock import describe
from .latency import BenchResult
from .op_profile import ProfileResult, captured_share
from .report import headroom_line, known_lines, share_words, split_line

PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac"]
CSS = """
body{font:14px/1.45 -apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1100px;
color:#222;padding:0 16px}h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;
border-bottom:1px solid #ddd;padding-bottom:4px}.meta{color:#666}table{border-collapse:collapse;margin:8px 0;
font-size:13px}th,td{border:1px solid #ddd;padding:4px 8px;text-align:right}th{background:#f4f4f4}
td.l,th.l{text-align:left}.pass{color:#2e7d32;font-weight:600}.fail{color:#c62828;font-weight:600}
.verdict{font-size:16px;font-weight:600}.kept{color:#2e7d32}.dropped{color:#c62828}svg text{font-size:12px}
ul.signals li{margin:4px 0}.legend span{display:inline-block;margin-right:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
"""


def _e(x: object) -> str:
    return html.escape(str(x))


def _table(headers: list[str], rows: list[list[object]], left: int = 1) -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{_e(h)}</th>' for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def latency_chart(b: BenchResult) -> str:
    width, bar, gap, left = 700, 26, 14, 90
    top = max(m.p90_ms for m in b.models) * 1.1
    h = len(b.models) * (bar + gap) + 30
    parts = [f'<svg id="latency-chart" width="{width}" height="{h}" role="img" aria-label="latency">']
    for i, m in enumerate(b.models):
        y = 10 + i * (bar + gap)
        w = (width - left - 80) * m.median_ms / top
        p90 = left + (width - left - 80) * m.p90_ms / top
        parts.append(f'<text x="0" y="{y + bar * 0.7}">{_e(m.label)}</text>'
                     f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar}" fill="{PALETTE[i % 10]}"/>'
                     f'<line x1="{left + w:.1f}" x2="{p90:.1f}" y1="{y + bar / 2}" y2="{y + bar / 2}" stroke="#333"/>'
                     f'<line x1="{p90:.1f}" x2="{p90:.1f}" y1="{y + 6}" y2="{y + bar - 6}" stroke="#333"/>'
                     f'<text x="{p90 + 6:.1f}" y="{y + bar * 0.7}">{m.median_ms:.3f} ms</text>')
    parts.append("</svg>")
    return "".join(parts)


def breakdown_chart(profiles: list[ProfileResult], labels: list[str]) -> str:
    ops = Counter()
    for p in profiles:
        for s in p.by_type:
            ops[s.op] += s.total_us
    top = [op for op, _ in ops.most_common(9)]
    colors = {op: PALETTE[i] for i, op in enumerate(top)}
    width, bar, gap, left = 700, 28, 16, 90
    scale = (width - left - 90) / max(p.kernel_ms for p in profiles)
    h = len(profiles) * (bar + gap) + 20
    parts = [f'<svg id="breakdown-chart" width="{width}" height="{h}" role="img" aria-label="op time">']
    for i, (p, label) in enumerate(zip(profiles, labels, strict=True)):
        y = 8 + i * (bar + gap)
        x = float(left)
        parts.append(f'<text x="0" y="{y + bar * 0.7}">{_e(label)}</text>')
        other = 0.0
        for s in p.by_type:
            if s.op not in colors:
                other += s.total_us
                continue
            w = s.total_us / 1e3 * scale
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar}" fill="{colors[s.op]}">'
                         f'<title>{_e(s.op)}: {s.total_us / 1e3:.3f} ms ({s.share * 100:.0f}%)</title></rect>')
            x += w
        if other:
            w = other / 1e3 * scale
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar}" fill="{PALETTE[9]}"/>')
            x += w
        parts.append(f'<text x="{x + 6:.1f}" y="{y + bar * 0.7}">{p.kernel_ms:.3f} ms</text>')
    parts.append("</svg>")
    legend = "".join(f'<span><i style="background:{c}"></i>{_e(op)}</span>' for op, c in colors.items())
    return "".join(parts) + f'<div class="legend">{legend}<span><i style="background:{PALETTE[9]}"></i>other</span></div>'


def _bench_section(b: BenchResult, named: bool = False, first: bool = True) -> str:
    rows = [[_e(m.label), f"{m.session_ms:.1f}", f"{m.first_run_ms:.3f}", f"{m.median_ms:.3f}", f"{m.p90_ms:.3f}",
             f"{m.p99_ms:.3f}", f"{m.min_ms:.3f}", f"{m.spread * 100:.1f}%", m.runs] for m in b.models]
    head = f"Latency: {_e(b.profile)} profile" if named else "Latency"
    out = [f"<h2>{head}</h2><p class=meta>{_e(b.provider)} execution provider, {b.threads} thread(s), "
           f"optimization level {_e(b.level)}, inputs {_e(b.inputs)}; runs interleaved in one process.</p>",
           latency_chart(b),
           _table(["model", "session ms", "first run ms", "median ms", "p90 ms", "p99 ms", "min ms", "spread",
                   "runs"], rows)]
    if b.ratio is not None:
        ident = ' id="verdict"' if first else ""
        a, b_ = (b.models[0].label, b.models[1].label) if len(b.models) > 1 else ("A", "B")
        out.append(f'<p class="verdict"{ident}>{_e(b_)} vs {_e(a)}: {b.speedup:.3f}x speed, time ratio '
                   f"{_e(b.ratio)} (95% CI, {_e(describe(b.estimator))}) &rarr; {_e(b.verdict)}</p><p class=meta>"
                   f"Noise floor: a second session of each model differs from its first by {b.floor:.1%} on average; "
                   f"{_e(b_)} must differ from {_e(a)} by more than that.</p>")
    if b.batches:
        labels = [m.label for m in b.models]
        rows = [[p.batch] + [f"{p.median_ms[lab]:.3f}" for lab in labels] + [f"{p.throughput[lab]:.1f}"
                                                                              for lab in labels] for p in b.batches]
        out.append("<h3>Batch sweep</h3>" + _table(
            ["batch"] + [f"{lab} median ms" for lab in labels] + [f"{lab} samples/s" for lab in labels], rows))
    return "".join(out)


def _profile_section(profiles: list[ProfileResult], labels: list[str]) -> str:
    out = ["<h2>Where the time goes</h2>", breakdown_chart(profiles, labels)]
    ops = sorted({s.op for p in profiles for s in p.by_type},
                 key=lambda op: -max((s.total_us for p in profiles for s in p.by_type if s.op == op), default=0))
    rows = []
    for op in ops[:25]:
        row = [_e(op)]
        for p in profiles:
            s = next((s for s in p.by_type if s.op == op), None)
            row += ["" if s is None else f"{s.calls_per_run:.0f}", "" if s is None else f"{s.total_us / 1e3:.3f}",
                    "" if s is None else f"{s.share * 100:.1f}%", "" if s is None else f"{s.gflops:.2f}",
                    "" if s is None else s.gbytes_text]
        rows.append(row)
    heads = ["op"] + [f"{lab} {h}" for lab in labels for h in ("calls", "ms", "share", "GFLOP/s", "GB/s")]
    out.append(_table(heads, rows))
    for p, lab in zip(profiles, labels, strict=True):
        out.append(f"<p class=meta>{_e(lab)}: kernel times sum to {p.kernel_ms:.3f} ms = {p.agreement * 100:.0f}% of "
                   f"the measured latency {p.latency_ms:.3f} ms (profiled run {p.run_ms:.3f} ms). Peaks measured on "
                   f"this machine: {p.peaks.gflops:.1f} GFLOP/s (GEMM), {p.peaks.gbytes:.1f} GB/s (copy); the profiler's "
                   f"own {p.overhead_us:.1f} us per op call (calibrated) is subtracted.</p>"
                   f'<ul class="signals">' + "".join(f"<li>{_e(s)}</li>" for s in p.signals)
                   + f"<li>{_e(headroom_line(p))}" + _known_list(p) + f"</li><li>{_e(split_line(p))}</li></ul>")
    share = captured_share(profiles[0], profiles[1]) if len(profiles) == 2 else None
    if share is not None:
        out.append(f"<p class=meta>{_e(labels[1])} {share_words(share)} the gap between {_e(labels[0])} "
                   f"and its GEMM-bound limit ({profiles[0].gemm_bound_ms:.3f} ms).</p>")
    return "".join(out)


def _known_list(p: ProfileResult) -> str:
    """What onnxfuse knows about each remaining cost, as a nested list (empty when not asked)."""
    lines = known_lines(p)
    return f'<ul class="known">{"".join(f"<li>{_e(x)}</li>" for x in lines)}</ul>' if lines else ""


def _optimize_section(result) -> str:
    out = ["<h2>Fusions</h2>"]
    created: dict[str, Counter] = {}
    for a in result.applications:
        created.setdefault(a.rule, Counter()).update(a.ops)
    rows = [[_e(rule), n, _e(", ".join(sorted(created[rule])))] for rule, n in sorted(result.fired.items())]
    out.append(_table(["rule", "rewrites", "creates"], rows) if rows else "<p>No rule rewrites kept.</p>")
    if result.cleanups:
        out.append("<p class=meta>cleanups (exact steps, not rules): " + _e(", ".join(
            f"{k} x{n}" for k, n in sorted(result.cleanups.items()))) + "</p>")
    out.append(f"<p class=meta>nodes {result.nodes_before} &rarr; {result.nodes_after}</p>")
    if result.rolled_back:
        out.append("<h3>Rolled back by validation</h3>" + _table(
            ["rule", "value", "why"], [[_e(r.rule), _e(r.root), _e(r.reason)] for r in result.rolled_back], 3))
    m = result.measure
    if m is not None and m.groups:
        rows = [[_e(g.group), _e(", ".join(g.rules)), g.rewrites, "" if g.gain is None else f"{g.gain * 100:+.1f}%",
                 _e(g.effect or ""), f'<span class="{"kept" if g.kept else "dropped"}">'
                 f'{"kept" if g.kept else "dropped"}</span>', _e(g.source)] for g in m.groups]
        kept = sum(g.kept for g in m.groups)
        out.append(f"<details id=selection><summary>Measured selection: {kept} of {len(m.groups)} group(s) kept "
                   "(click to expand)</summary>"
                   f"<p class=meta>timed on {_e(m.provider)} at {m.threads} thread(s): the decisions hold for that "
                   f"thread count{_e(f' (judged on {describe(m.estimator)})' if m.estimator else '')}</p>"
                   + _table(["fused op group", "rules", "rewrites", "latency saved", "with/without [95% CI]", "",
                             "how"], rows, 2) + "</details>")
    out.append(f"<h2>Validation</h2><p>{_e(result.validation)}</p>")
    rows = [[_e(c.name), _e(c.dtype), _e("x".join(map(str, c.shape))), f"{c.max_abs:.2e}", f"{c.max_rel:.2e}",
             f"{c.cosine:.6f}", f"{c.min_tolerance:.1e}",
             '<span class="pass">pass</span>' if c.passed else '<span class="fail">FAIL</span>'] for c in result.checks]
    if rows:
        out.append(_table(["output", "dtype", "shape", "max abs", "max rel", "cosine", "min tol", ""], rows, 3))
    return "".join(out)


def headline(bench: BenchResult | None, result) -> str:
    """The page's first lines: what the run decided and what it measured, in words."""
    lines = []
    m = getattr(result, "measure", None)
    if m is not None and m.final is not None:
        word = m.final.final_word(m.floor)
        lines.append(f"optimize measured the output at {m.final.median:.3f} of the input's latency "
                     f"({_e(m.final)}, {_e(describe(m.estimator) if m.estimator else 'wall time')}) &rarr; "
                     f"<b>{_e(word)}</b>")
    elif m is not None:
        lines.append(f"optimize: {_e(m.note or m.confirmed or 'nothing timed')}")
    if bench is not None and bench.ratio is not None:
        lines.append(f"bench: output vs input {_e(bench.ratio)} on {_e(describe(bench.estimator))} &rarr; "
                     f"<b>{_e(bench.verdict)}</b>; median {bench.models[0].median_ms:.3f} ms &rarr; "
                     f"{bench.models[1].median_ms:.3f} ms")
    if result is not None:
        lines.append(f"{sum(result.fired.values())} rewrite(s) kept, nodes {result.nodes_before} &rarr; "
                     f"{result.nodes_after}; validation: {_e(result.validation)}")
    return f'<div id="headline" class="verdict">{"<br>".join(lines)}</div>' if lines else ""


def render(title: str, bench: BenchResult | None = None, profiles: list[ProfileResult] | None = None,
           labels: list[str] | None = None, result=None) -> str:
    import onnxruntime as ort

    body = [f"<h1>{_e(title)}</h1><p class=meta>onnxfuse report, {_dt.datetime.now():%Y-%m-%d %H:%M}, "
            f"onnxruntime {_e(ort.__version__)}</p>", headline(bench, result)]
    if bench is not None:  # the verdict and the latency chart first
        for n, one in enumerate([bench, *bench.profiles]):
            body.append(_bench_section(one, named=bool(bench.profiles), first=n == 0))
    if result is not None:
        body.append(_optimize_section(result))
    if profiles:
        body.append(_profile_section(profiles, labels or [p.path for p in profiles]))
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title><style>{CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>")


def write(path: str, page: str) -> None:
    import contextlib
    import os
    import tempfile

    from ..errors import OnnxfuseError
    from ..load.write import default_mode

    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".onnxfuse-", suffix=".html", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        default_mode(tmp)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise OnnxfuseError(f"{path}: cannot write the report ({e.strerror or e})") from None
    finally:
        if tmp is not None:  # nothing partial left behind
            with contextlib.suppress(OSError):
                os.unlink(tmp)
