"""bench / profile / HTML report mechanics (no timing assertions: speed is measured in benchmarks/)."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from conftest import MODELS

from onnxfuse import OptimizeOptions, optimize
from onnxfuse.errors import InputSpecError
from onnxfuse.inspect.html_report import render
from onnxfuse.inspect.latency import bench
from onnxfuse.inspect.op_profile import memory_bound_signals, node_flops, profile

CNN = os.path.join(MODELS, "cnn_small.onnx")


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("opt") / "cnn.opt.onnx")
    result = optimize(CNN, out, OptimizeOptions(measure=False))
    return out, result


def test_bench_two_models(optimized):
    res = bench([CNN, optimized[0]], min_runs=20, budget_s=0.2)
    assert [m.label for m in res.models] == ["A", "B"]
    for m in res.models:
        assert m.runs >= 20 and len(m.samples_ms) == m.runs
        assert 0 < m.min_ms <= m.median_ms <= m.p90_ms <= m.p99_ms
        assert m.session_ms > 0 and m.first_run_ms > 0 and m.warmup_runs >= 20
    assert (res.verdict in ("faster", "slower", "no significant change") or res.verdict.startswith("within the noise floor"))
    assert res.ratio.low <= res.ratio.median <= res.ratio.high
    assert res.inputs == {"x": [1, 3, 32, 32]}  # what optimize times at: batch 1 (validation runs batch 2)
    json.dumps(res.to_json())


def test_batch_sweep(optimized):
    res = bench([CNN, optimized[0]], min_runs=10, budget_s=0.2, batches=[1, 4])
    assert [p.batch for p in res.batches] == [1, 4]
    for p in res.batches:
        for lab in ("A", "B"):
            assert p.throughput[lab] == pytest.approx(p.batch / (p.median_ms[lab] / 1e3))


def test_batch_sweep_needs_dynamic_batch(tmp_path):
    import onnx.helper as oh
    from conftest import make_model, save

    path = save(make_model([oh.make_node("Relu", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3])]), tmp_path / "s.onnx")
    with pytest.raises(InputSpecError, match="dynamic first"):
        bench([path], min_runs=5, budget_s=0.05, batches=[1, 2])


def test_node_flops():
    assert node_flops("Conv", [[2, 3, 32, 32], [16, 3, 3, 3], [16]], [[2, 16, 32, 32]]) == 2 * 2 * 16 * 32 * 32 * 27
    assert node_flops("MatMul", [[2, 8, 64], [64, 32]], [[2, 8, 32]]) == 2 * 2 * 8 * 32 * 64
    assert node_flops("FusedGemm", [[4, 64], [64, 10]], [[4, 10]]) == 2 * 4 * 10 * 64
    assert node_flops("LayerNormalization", [[2, 8, 32]], [[2, 8, 32]]) == 8 * 2 * 8 * 32
    assert node_flops("Relu", [[10]], [[10]]) == 10


def test_profile_tables(optimized):
    r = profile(optimized[0], runs=5, warmup=2)
    assert sum(s.share for s in r.by_type) == pytest.approx(1.0)
    assert r.kernel_ms == pytest.approx(sum(s.total_us for s in r.by_node) / 1e3)
    ops = {s.op for s in r.by_type}
    assert "Conv" in ops or "FusedConv" in ops
    gemm = next(s for s in r.by_node if s.op == "FusedGemm")
    assert gemm.replaces == "/relu/Relu,/fc1/Gemm"  # linked to the original nodes it replaced
    assert gemm.flops == 2 * 1 * 32 * 64  # [1, 64] x [64, 32] -> [1, 32]: optimize times batch 1
    assert r.peaks.gflops > 0 and r.peaks.gbytes > 0
    assert len(r.signals) == 3 and r.signals[1].startswith("many short ops:")
    assert r.latency_ms > 0 and r.agreement > 0
    # what onnxfuse knows about each remaining cost (inspect/remaining.py), in the JSON too
    assert set(r.known) == {s.op for s in r.remaining_costs()} and all(n.text for n in r.known.values())
    assert all(c["known"]["text"] == r.known[c["op"]].text for c in r.to_json()["remaining_costs"])
    json.dumps(r.to_json())


def test_signals_wording(optimized):
    r = profile(optimized[0], runs=3, warmup=1)
    s = memory_bound_signals(r, batch_gain=2.4, batch_range="1 to 16")
    assert "throughput rises 2.40x from batch 1 to 16" in s[2]
    assert "stays flat" in memory_bound_signals(r, 1.05, "1 to 8")[2]


def _page(optimized):
    out, result = optimized
    b = bench([CNN, out], ["input", "output"], min_runs=10, budget_s=0.1)
    profiles = [profile(p, runs=3, warmup=1) for p in (CNN, out)]
    return render("test report", bench=b, profiles=profiles, labels=["input", "output"], result=result)


def test_html_is_self_contained(optimized):
    page = _page(optimized)
    for must in ('id="latency-chart"', 'id="breakdown-chart"', 'id="verdict"', "Fusions", "Validation",
                 "conv-bn-fold", "logits", "Where the time goes"):
        assert must in page, must
    # the models are labelled input and output: the verdict says so too (it said "B vs A")
    assert 'id="verdict">output vs input: ' in page and "B vs A" not in page
    low = page.lower()
    assert "http://" not in low.replace("http://www.w3", "") and "https://" not in low and "<script" not in low
    # the headline first (the verdicts in words), then the latency chart, then what was fused
    assert page.index('id="headline"') < page.index('id="latency-chart"') < page.index("Fusions")
    assert "bench: output vs input" in page and "rewrite(s) kept" in page


def test_optimize_html_says_where_it_wrote_the_report_and_names_the_model_absolutely(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import shutil as sh

    sh.copy(CNN, "m.onnx")
    code, _, stderr = cli("optimize", "m.onnx", "o.onnx", "--no-measure", "--html", "r.html")
    assert code == 0, stderr
    page = (tmp_path / "r.html").read_text()
    assert f"report written to {tmp_path / 'r.html'}" in stderr
    assert f"<title>onnxfuse optimize: {tmp_path / 'm.onnx'}</title>" in page


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_html_renders_in_headless_chromium(optimized, tmp_path):
    html_path = tmp_path / "report.html"
    html_path.write_text(_page(optimized))
    png = tmp_path / "shot.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    subprocess.run([CHROMIUM, *flags, f"--screenshot={png}", "--window-size=1200,1800", f"file://{html_path}"],
                   capture_output=True, timeout=120)
    assert png.exists() and png.stat().st_size > 20_000
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", f"file://{html_path}"], capture_output=True, text=True,
                         timeout=120).stdout
    assert 'id="latency-chart"' in dom and "<rect" in dom
    # the screenshot is not blank: decode the PNG's pixel rows and look for many distinct colours
    import zlib

    data = png.read_bytes()
    chunks, i = [], 8
    while i < len(data):
        n = int.from_bytes(data[i:i + 4], "big")
        if data[i + 4:i + 8] == b"IDAT":
            chunks.append(data[i + 8:i + 8 + n])
        i += 12 + n
    raw = np.frombuffer(zlib.decompress(b"".join(chunks)), np.uint8)
    assert len(np.unique(raw)) > 50


def test_cli_bench_and_profile(cli, optimized, tmp_path):
    code, stdout, stderr = cli("bench", CNN, optimized[0], "--budget", "0.1", "--runs", "10", "--json")
    assert code == 0, stderr
    data = json.loads(stdout)
    assert data["schema"] == "onnxfuse.bench/1"
    assert (data["verdict"] in ("faster", "slower", "no significant change") or data["verdict"].startswith("within the noise floor")) and len(data["models"]) == 2
    html = tmp_path / "p.html"
    code, stdout, stderr = cli("profile", CNN, optimized[0], "--runs", "3", "--nodes", "--html", html)
    assert code == 0, stderr
    assert "op time by type" in stdout and "kernel times sum to" in stdout and html.exists()
    # A and B judged as bench and optimize judge them: interleaved with an A/A control, one verdict
    verdict_line = next(line for line in stdout.splitlines() if "interleaved with a second session of each" in line)
    assert "on thread CPU time ->" in verdict_line and data["estimator"] == "cpu"
    word = verdict_line.rsplit("-> ", 1)[1]
    gap = next(line for line in stdout.splitlines() if "the gap between A" in line)
    assert ("is slower" in gap) == (word == "slower")  # no "slower" a verdict does not say
    assert stdout.count("GEMM-bound limit") >= 2 and "headroom" in stdout and "the gap between A" in stdout and "GEMM-bound limit" in html.read_text()
    assert "this file was not optimized" in stdout and 'class="known"' in html.read_text()  # notes on the costs
    code, _, stderr = cli("bench", str(tmp_path / "missing.onnx"))
    assert code == 1 and "no such file" in stderr
    code, _, stderr = cli("bench", CNN, "--batch", "1,x")
    assert code == 1 and "--batch 1,x" in stderr


def test_bench_verdict_is_optimizes_verdict_beyond_the_a_a_noise_floor():
    """bench judges B against A and a second session of A with the same function optimize decides with
    (measure/verdicts.py): the A/A difference is the floor B must clear, plus SIGNIFICANT."""
    from onnxfuse.measure.verdicts import verdict

    a, a2 = [1.0] * 20, [1.0] * 20
    assert verdict({"A": a, "A2": a2, "B": [0.97] * 20}, "B", ("A", "A2")).word == "faster"
    a2 = [1.04] * 20  # order alone shows 4%: B is below A and A2's mean (1.02), but not by more than that
    v = verdict({"A": a, "A2": a2, "B": [0.99] * 20}, "B", ("A", "A2"))
    assert v.floor == pytest.approx(0.04) and v.word == "within the noise floor (±4.5%): not counted as faster"
    assert verdict({"A": a, "A2": a, "B": [1.0] * 20}, "B", ("A", "A2")).word == "no significant change"
    assert verdict({"A": a, "A2": [1.01] * 20, "B": [1.10] * 20}, "B", ("A", "A2")).word == "slower"


def test_the_noise_floor_is_what_an_a_a_pair_differs_by_beyond_its_rounds_noise():
    """The floor is how far the A/A pair's interval lies from 1 (verdicts.offset), not its median's distance: a
    twin whose rounds scatter +-3% around A, its median 1% off by chance, shows no offset for sure, and the floor
    stays at MIN_FLOOR, so B's 2% counts as faster; the same twin 3% slower in every round keeps its interval
    clear of 1, and its offset counts whole."""
    from onnxfuse.measure.stats import paired_ratio
    from onnxfuse.measure.verdicts import MIN_FLOOR, offset, verdict

    rng = np.random.default_rng(3)
    a = [1.0] * 21
    noisy = list(1.01 + rng.uniform(-0.03, 0.03, 21))
    aa = paired_ratio(noisy, a)
    assert abs(aa.median - 1) > 0.005 and aa.low < 1 < aa.high and offset(aa) == 0.0
    b = [0.98] * 21
    v = verdict({"A": a, "A2": noisy, "B": b}, "B", ("A", "A2"))
    assert v.floor == MIN_FLOOR and v.word == "faster"
    slow = [1.03 + x - 1.01 for x in noisy]  # the same scatter, 3% up: clear of 1 by what its interval shows
    aa_slow = paired_ratio(slow, a)
    assert aa_slow.low > 1.0 and offset(aa_slow) == pytest.approx(aa_slow.low - 1)
    assert verdict({"A": a, "A2": [1.03] * 21, "B": b}, "B", ("A", "A2")).floor == pytest.approx(0.03)


def test_gemm_bound_limit_headroom_and_captured_share():
    """The limit counts only the FLOP-carrying ops at the measured GEMM peak; the headroom is the rest of the
    latency; the share captured is how much of the input's gap to its limit the output removed."""
    from onnxfuse.inspect.op_profile import NodeStat, OpStat, Peaks, ProfileResult, captured_share

    def result(latency_ms, nodes):
        by_type = [OpStat(op, 1, us, 0.0, us, 0, 0, 0, 0) for op, us in sorted(
            {n.op: sum(m.total_us for m in nodes if m.op == n.op) for n in nodes}.items(), key=lambda kv: -kv[1])]
        return ProfileResult("m", 10, latency_ms, latency_ms, latency_ms, by_type, nodes, Peaks(gflops=100.0, gbytes=10.0))

    conv = NodeStat("c", "Conv", 2, 3000.0, 0, 1e8)  # 2 calls x 0.1 GFLOP at 100 GFLOP/s: 2 ms
    add = NodeStat("a", "Add", 10, 4000.0, 0, 1e9)  # elementwise FLOPs do not count toward the limit
    before = result(10.0, [conv, add, NodeStat("r", "Relu", 5, 3000.0, 0, 1e6)])
    assert abs(before.gemm_bound_ms - 2.0) < 1e-9 and abs(before.headroom_ms - 8.0) < 1e-9
    assert [s.op for s in before.remaining_costs()] == ["Add", "Relu"]
    after = result(6.0, [conv, add])
    assert abs(captured_share(before, after) - 0.5) < 1e-9  # (10 - 6) / (10 - 2)
    assert captured_share(result(1.0, [NodeStat("c", "Conv", 10, 1000.0, 0, 1e8)]), after) is None  # no headroom
    j = before.to_json()
    assert j["gemm_bound_ms"] == before.gemm_bound_ms and j["remaining_costs"][0]["op"] == "Add"


def test_headroom_split_by_what_could_remove_it():
    """FLOP ops above their FLOPs at the GEMM peak: the part their bytes at the copy peak explain (roofline) and
    the kernel time above it; ops outside the GEMM class; latency between kernels. Data in cache (bytes at the
    copy peak beyond the time taken) counts no more than the time above the limit."""
    from onnxfuse.inspect.op_profile import NodeStat, Peaks, ProfileResult
    from onnxfuse.inspect.report import split_line

    peaks = Peaks(gflops=100.0, gbytes=10.0)  # 1e5 FLOPs and 1e4 bytes per microsecond
    gemv = NodeStat("g", "Gemm", 1, 700.0, 5e6, 1e6)  # 10 us at peak, 500 us of bytes: 490 memory, 200 kernel
    dense = NodeStat("c", "Conv", 2, 600.0, 1e4, 2e7)  # 400 us at peak, 2 us of bytes: 200 kernel
    cached = NodeStat("d", "Conv", 1, 50.0, 1e6, 1e6)  # 10 us at peak, 100 us of bytes but took 50: 40 memory
    add = NodeStat("a", "Add", 3, 300.0, 1e5, 1e4)
    p = ProfileResult("m", 10, 2.0, 2.0, 1.65, [], [gemv, dense, cached, add], peaks)
    h = p.headroom_split()
    assert h.flop_memory_ms == pytest.approx(0.53) and h.flop_kernel_ms == pytest.approx(0.4)
    assert h.other_ms == pytest.approx(0.3) and h.between_ms == pytest.approx(0.35)
    # the parts add up to the headroom: latency less the FLOPs at the GEMM peak
    assert h.flop_memory_ms + h.flop_kernel_ms + h.other_ms + h.between_ms == pytest.approx(p.headroom_ms)
    assert p.to_json()["headroom_split"] == h.__dict__
    line = split_line(p)
    assert "outside GEMM work 0.300 ms (19%)" in line and "between kernels 0.350 ms (22%)" in line


def test_profile_at_one_batch_size_profiles_there():
    """`profile --batch 4`: one batch size is where the model is profiled (optimize times batch 1 here),
    not a sweep of one point silently ignored."""
    at_default = profile(CNN, runs=3, known=False)
    at_4 = profile(CNN, runs=3, batches=[4], known=False)
    total = lambda r: sum(n.flops * n.calls_per_run for n in r.by_node)  # noqa: E731
    assert total(at_4) == pytest.approx(4 * total(at_default))


def test_profile_at_one_batch_size_is_refused_where_it_cannot_apply(cli, tmp_path):
    import onnx.helper as oh
    from conftest import make_model, save

    fixed = save(make_model([oh.make_node("Relu", ["x"], ["y"])], [("x", [2, 3])], [("y", [2, 3])]), tmp_path / "f.onnx")
    code, _, stderr = cli("profile", fixed, "--batch", "4", "--runs", "3")
    assert code == 1
    assert stderr.strip() == ("onnxfuse: error: --batch 4: profiling at one batch size needs a model whose inputs "
                              "share a dynamic first (batch) dimension")
    code, _, stderr = cli("profile", CNN, "--batch", "4", "--shape", "batch=2", "--runs", "3")
    assert code == 1
    assert stderr.strip() == "onnxfuse: error: --batch 4: the shapes given set the batch size to 2"
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.zeros((2, 3, 32, 32), np.float32))
    code, _, stderr = cli("profile", CNN, "--batch", "4", "--inputs", npz, "--runs", "3")
    assert code == 1
    assert stderr.strip() == ("onnxfuse: error: --batch 4: profiling at one batch size cannot take an inputs file "
                              "(its arrays fix the batch size)")


def test_profile_of_an_optimized_model_runs_on_the_originals_inputs(optimized, monkeypatch):
    """`profile A B` finds the inputs on A and profiles B on them, as bench times both on A's: an optimized model
    whose own input search fails (a folded silero VAD) is still profiled."""
    from onnxfuse.inspect import latency

    seen = []
    real = latency.probed_inputs
    monkeypatch.setattr(latency, "probed_inputs", lambda path, *a, **k: seen.append(path) or real(path, *a, **k))
    r = profile(optimized[0], runs=3, warmup=1, known=False, inputs_from=CNN)
    assert seen == [CNN] and r.latency_ms > 0
