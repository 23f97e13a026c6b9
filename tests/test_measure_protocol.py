"""The timing protocol (measure/): the estimator, measuring longer while the verdict is undecided, the one
verdict, and what measured selection does with an undecided class (fake timings and clocks: what is asserted
must not depend on how busy the machine is)."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from onnxfuse.measure import timing as T
from onnxfuse.measure.clock import CPU, WALL, estimator_for
from onnxfuse.measure.lock import timing_lock
from onnxfuse.measure.stats import UNDECIDED, Ratio
from onnxfuse.measure.verdicts import Verdict, aa_contrast, verdict
from onnxfuse.regions.cost import OpCost
from onnxfuse.select import decision_cache as DC
from onnxfuse.select.region_run import weak_evidence


def test_the_estimator_is_thread_cpu_time_only_where_onnxruntime_runs_on_the_calling_thread():
    assert estimator_for("cpu", 1) == CPU
    assert estimator_for("cpu", 2) == WALL and estimator_for("cuda", 1) == WALL


class _Clocked:
    """A session whose run advances a fake clock by a cost drawn from its list (cycled)."""

    def __init__(self, clock, costs):
        self.clock, self.costs, self.i = clock, costs, 0

    def run(self, _out, _feeds):
        self.clock[0] += self.costs[self.i % len(self.costs)]
        self.i += 1


def _fake_clock(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(T, "now", lambda: (clock[0], clock[0] * 0.5))  # CPU time: half the wall time
    monkeypatch.setattr(T.time, "perf_counter", lambda: clock[0])
    return clock


def test_timing_runs_on_while_the_verdict_is_undecided_and_stops_once_it_is_clear(monkeypatch):
    clock = _fake_clock(monkeypatch)
    sessions = {"a": _Clocked(clock, [1e-3]), "b": _Clocked(clock, [1e-3]), "f": _Clocked(clock, [0.5e-3])}
    checks = []

    def never(t):
        checks.append(len(t["a"]))
        return False

    undecided = T.interleave(sessions, [(1.0, {})], estimator=CPU, min_runs=20, deadline=1e9, max_runs=300,
                             settled=never)
    assert len(undecided["a"]) == 300  # on to max_runs while the verdict is not clear
    assert checks[0] == 20 and len(checks) < 20  # checked from min_runs on, at growing intervals (each a bootstrap)
    done = T.interleave(sessions, [(1.0, {})], estimator=CPU, min_runs=20, deadline=1e9, max_runs=300,
                        settled=lambda t: verdict(t, "f", ("a", "b")).decided)
    assert len(done["a"]) == 20 and verdict(done, "f", ("a", "b")).faster
    # both clocks are kept; the mapping reads the estimator's
    assert done.estimator == CPU and done["a"][0] == pytest.approx(0.5e-3) and done.on(WALL)["a"][0] == pytest.approx(1e-3)
    plain = T.interleave(sessions, [(1.0, {})], estimator=CPU, min_runs=20, deadline=1e9)
    assert len(plain["a"]) == 20  # no verdict to wait for: the minimum


def test_a_round_interleaves_the_sessions_run_by_run_and_counts_the_faster_half(monkeypatch):
    """Runs of one session in a round are interleaved with the others' (two sessions alternate), not taken as a
    block: consecutive runs share the machine's slow and fast moments. A session's round time is the median of its
    runs: one run disturbed by another process does not move it."""
    clock = _fake_clock(monkeypatch)
    calls = []

    class S:
        def __init__(self, name, times):
            self.name, self.times, self.k = name, times, 0

        def run(self, _out, _feeds):
            calls.append(self.name)
            clock[0] += self.times[self.k % len(self.times)]
            self.k += 1
    # warm-up runs (one each) then rounds of 4 passes: a's runs 1, 1, 1, 9 ms (one disturbed), b's 2 ms
    a, b = S("a", [1e-3, 1e-3, 1e-3, 1e-3, 9e-3]), S("b", [2e-3])
    t = T.interleave({"a": a, "b": b}, [(1.0, {})], estimator=WALL, min_runs=2, floor_runs=2, repeat=4,
                     keep_runs=True)
    assert calls == ["a", "b"] + ["a", "b"] * 8
    assert t["a"][0] == pytest.approx(1e-3) and t["b"][0] == pytest.approx(2e-3)  # the 9 ms run does not count
    assert sorted(t.single_runs("a")) == pytest.approx([1e-3] * 7 + [9e-3])  # every run is kept besides
    assert T.round_times({"a": [3.0, 1.0, 2.0, 10.0]}) == {"a": 2.5}  # one session: the median of its runs


def test_a_round_divides_each_run_by_its_pass_so_a_slow_moment_shared_by_a_pass_cancels():
    """Passes 2 and 3 ran while something slowed the machine 2x: every session's runs there are slower alike; and
    a's run in pass 1 was disturbed alone (1.8x). The plain medians (a 1.9, b 3) would say b = 1.58a; each run
    divided by its pass's geometric mean, the round says what every undisturbed pass says, b = 2a, in seconds
    (times the passes' median mean)."""
    out = T.round_times({"a": [1.8, 2.0, 2.0, 1.0], "b": [2.0, 4.0, 4.0, 2.0]})
    assert out["b"] / out["a"] == pytest.approx(2.0)
    g = float(np.median([np.sqrt(3.6), np.sqrt(8), np.sqrt(8), np.sqrt(2)]))  # the passes' geometric means
    assert out["a"] == pytest.approx(g / np.sqrt(2)) and out["b"] == pytest.approx(g * np.sqrt(2))
    assert T.round_times({"a": [1.0, 1.0], "b": [1.0, 1.0]}) == {"a": 1.0, "b": 1.0}


@pytest.mark.parametrize("n", range(1, 10))
def test_passes_never_run_a_session_twice_in_a_row_and_balance_places_and_predecessors(n):
    """A session run right after itself finds its weights in the cache (silero VAD: 18-20% less CPU time), so no
    session follows itself, within a pass or across passes (the cycle repeats); over the cycle each session holds
    each place in a pass equally often and follows each other session equally often within the passes."""
    cycle = T.pass_orders(n)
    assert all(sorted(p) == list(range(n)) for p in cycle)
    seq = [x for p in cycle for x in p] * 2  # twice: the cycle runs on from its end to its start
    if n > 1:
        assert all(a != b for a, b in zip(seq, seq[1:], strict=False))
    if n > 2:
        places = {(x, i) for p in cycle for i, x in enumerate(p)}
        assert len(places) == n * n and all(sum(p[i] == x for p in cycle) == len(cycle) // n for x, i in places)
        follows = [(p[i], p[i + 1]) for p in cycle for i in range(n - 1)]
        assert {follows.count(pair) for pair in set(follows)} == {len(cycle) // n} and len(set(follows)) == n * (n - 1)


def test_four_sessions_run_in_the_designs_order_across_rounds(monkeypatch):
    """A comparison's four sessions (the candidate's two, the base's two) run pass after pass in the design's order,
    which runs on from one round to the next: each round of two runs a session holds two different places."""
    clock = _fake_clock(monkeypatch)
    calls = []

    class S:
        def __init__(self, name):
            self.name = name

        def run(self, _out, _feeds):
            calls.append(self.name)
            clock[0] += 1e-3
    T.interleave({k: S(k) for k in ("c", "c2", "o", "o2")}, [(1.0, {})], estimator=WALL, min_runs=2, floor_runs=2,
                 repeat=2)
    order = ["c", "c2", "o", "o2"]
    assert calls[4:] == [order[x] for p in T.pass_orders(4) for x in p]  # after one warm-up run each


def test_a_deadline_ends_an_undecided_timing(monkeypatch):
    clock = _fake_clock(monkeypatch)
    s = {"a": _Clocked(clock, [1e-3, 2e-3]), "b": _Clocked(clock, [2e-3, 1e-3]), "f": _Clocked(clock, [1e-3, 2.2e-3])}
    t = T.interleave(s, [(1.0, {})], estimator=WALL, min_runs=10, deadline=0.3, settled=lambda _t: False)
    assert 10 <= len(t["a"]) < T.MAX_RUNS and clock[0] == pytest.approx(0.3, abs=0.01)


def test_the_verdict_says_undecided_only_where_the_interval_crosses_the_line():
    line = Verdict(Ratio(0.98, 0.96, 1.0), 0.0, CPU)  # across 1 - 0.5%
    assert not line.decided and line.outcome == UNDECIDED and not line.faster
    assert Verdict(Ratio(0.9, 0.88, 0.92), 0.0, CPU).outcome == "faster"
    assert Verdict(Ratio(1.0, 0.997, 1.01), 0.0, CPU).outcome == "no significant change"
    assert "thread CPU time" in line.line() and "±0.0%" in line.line()




def _cost(calls, moved, flops=(1.0, 1.0), standard=True):
    return OpCost(calls, (moved, moved), (flops, flops), standard)


def test_the_op_cost_prior_counts_work_removed_into_standard_ops():
    removes = _cost((2, 1), (96.0, 64.0))
    assert removes.removes_work and removes.phrase() == "op cost: 1 kernel call fewer, 32 B fewer moved"
    assert not _cost((2, 1), (96.0, 128.0)).removes_work  # moves more
    assert not _cost((2, 1), (96.0, 64.0), flops=(1.0, 2.0)).removes_work
    assert not _cost((2, 2), (96.0, 64.0)).removes_work  # as many calls
    assert not _cost((2, 1), (96.0, 64.0), standard=False).removes_work  # a contrib kernel: its own quality


def test_weak_evidence_is_undecided_or_wall_time_under_load():
    assert weak_evidence({"source": UNDECIDED})
    assert weak_evidence({"source": "timed", "estimator": WALL, "load": 2.5})
    assert not weak_evidence({"source": "timed", "estimator": CPU, "load": 2.5})
    assert not weak_evidence({"source": "timed", "estimator": WALL, "load": 0.2})


def test_the_decision_cache_keeps_the_newest_decisions_up_to_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(DC, "MAX_ENTRIES", 3)
    c = DC.DecisionCache(directory=str(tmp_path))
    for i in range(5):
        c.entries = {}
        c.new = {f"k{i}": {"kind": "region", "ratio": [0.9, 0.8, 1.0], "when": f"2026-01-0{i + 1}T00:00:00"}}
        c.new[f"k{i}"]["when"] = f"2026-01-0{i + 1}T00:00:00"
        # put() stamps the time; the file's order is what the bound reads
        c.save()
    kept = DC.DecisionCache(directory=str(tmp_path))
    assert sorted(kept._read()) == ["k2", "k3", "k4"]


def test_the_timing_lock_says_when_it_waits_for_another_process(tmp_path):
    path = str(tmp_path / "timing.lock")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom onnxfuse.measure.lock import timing_lock\n"
        f"with timing_lock(path={path!r}):\n    print('held', flush=True)\n    time.sleep(1.0)\n")],
        stdout=subprocess.PIPE, text=True, env={**os.environ})
    assert holder.stdout.readline().strip() == "held"
    told = []
    t0 = time.perf_counter()
    with timing_lock(path=path, waiting=lambda: told.append(time.perf_counter() - t0)) as waited:
        pass
    holder.wait(10)
    assert len(told) == 1 and told[0] < 0.5 and waited > 0.2
    with timing_lock(path=path, waiting=lambda: told.append("again")):
        pass
    assert len(told) == 1  # a free lock: nothing to say


def test_the_confirmation_may_run_past_the_budget_by_its_grace_but_an_on_model_group_may_not(monkeypatch):
    """A kept selection is never left unconfirmed for want of a few seconds: the whole-model confirmation may end
    up to CONFIRM_GRACE of the budget past it (GPT-2 dynamo exports had their confirmation skipped); a group
    decided on the whole model is left out instead."""
    from onnxfuse.select import region_run as rr

    run = rr.RegionRun.__new__(rr.RegionRun)
    run.cap, run.clock = 15.0, lambda: 9.0  # 1 s left of the 10 s before the confirmation's third of a 15 s budget
    # a comparison costs about 5.6 s before its runs: two generations of four sessions of 0.5 s and a 0.2 s run each
    run.session_s, run.latency_s, run.profiles = 0.5, 0.2, [(1.0, {})]
    run.cache = DC.DecisionCache(enabled=False)
    run.report = type("R", (), {"rounds": 0})()
    cand = rr.Rewritten.__new__(rr.Rewritten)
    cand.__dict__.update(info=type("I", (), {"size_bytes": 1, "external_bytes": 0})(), proto=None)
    started = []

    def sessions(*_a, **_k):
        started.append(1)
        raise RuntimeError("ran")
    monkeypatch.setattr(rr, "Candidate", sessions)
    out = rr.RegionRun.compare(run, "in.onnx", cand, "k", "on model", {})
    assert out.ratio is None and not started and out.status.startswith("skipped: it would take about")
    with pytest.raises(RuntimeError, match="ran"):  # the confirmation goes ahead (its sessions are made)
        rr.RegionRun.compare(run, "in.onnx", cand, "k", "model", {})
    assert started


def test_the_aa_contrast_of_four_sessions_shows_no_change_whatever_the_effect():
    """sqrt(c2/c x o2/o): each side of the contrast holds one session of each model, so a 30% effect is not in it,
    and its per-round spread is one pair's divided by about sqrt(2)."""
    rng = np.random.default_rng(0)
    base = 1e-3 * (1 + 0.05 * rng.standard_normal(400))
    noise = {k: 1 + 0.01 * rng.standard_normal(400) for k in ("o", "o2", "c", "c2")}
    for effect in (1.0, 0.7):
        t = {"o": base * noise["o"], "o2": base * 1.02 * noise["o2"], "c": base * effect * 1.01 * noise["c"],
             "c2": base * effect * 0.99 * noise["c2"]}
        k = aa_contrast(t)
        assert abs(np.median(k) - 1) < 0.006
        pair = t["c2"] / t["c"]
        assert 0.6 < np.std(k) / np.std(pair) < 0.8


def test_a_kept_selection_is_called_slower_where_it_was_undone_as_slower():
    """The confirmation's word and what optimize did agree: an interval wholly above 1.005 is slower even inside
    a wider noise floor (the selection is undone for it), and says so."""
    int8_bert = Ratio(1.009, 1.0055, 1.0156)  # floor 1.35%: within it, but no evidence that it helps
    assert int8_bert.verdict_beyond(0.0135).startswith("within the noise floor")
    assert int8_bert.slower_beyond(0.0135) and int8_bert.final_word(0.0135) == "slower"
    assert Ratio(1.0, 0.99, 1.01).final_word(0.01) == "no significant change"
    assert Ratio(0.9, 0.88, 0.92).final_word(0.01) == "faster"


def test_sessions_made_again_in_the_opposite_order_cancel_the_offset_that_follows_the_order_they_were_made_in(
        monkeypatch):
    """A whole-model comparison's sessions are made twice (in_generations): A B B2 A2, then A2 B2 B A, timed for as
    many rounds each. A session made first that runs 1% slower and one made last that runs 2% faster (the offset
    measured on this project's machines) then sit once early and once late on each side of the A/A contrast and of
    each pair: the contrast centres at 1 and the noise floor is the floor (one generation: 0.985, and a floor of
    1.5%), while a real 10% effect reads the same either way."""
    clock = _fake_clock(monkeypatch)
    order_offset = [1.01, 1.0, 1.0, 0.98]  # by the position a session was made in
    made = []

    def open_sessions(reverse: bool) -> dict:
        labels = ["o", "c", "c2", "o2"]
        out = {}
        for pos, label in enumerate(labels[::-1] if reverse else labels):
            made.append(label)
            cost = (0.9e-3 if label.startswith("c") else 1e-3) * order_offset[pos]
            out[label] = _Clocked(clock, [cost])
        return {k: out[k] for k in labels}

    def one_generation(_reverse: bool) -> dict:
        return open_sessions(False)

    t1 = T.interleave(one_generation(False), [(1.0, {})], estimator=WALL, min_runs=12, round_s=0.01)
    made.clear()
    t2 = T.in_generations(open_sessions, [(1.0, {})], estimator=WALL, min_runs=12, round_s=0.02)
    assert made == ["o", "c", "c2", "o2", "o2", "c2", "c", "o"]  # the second generation the other way round
    assert t2.rounds() == 12 == len(t2["o2"])  # round i of each generation paired: as many rounds in both
    assert np.median(aa_contrast(t1)) == pytest.approx(np.sqrt(0.98 / 1.01), abs=1e-9)
    assert np.median(aa_contrast(t2)) == pytest.approx(1.0, abs=1e-9)
    one, both = verdict(t1, ("c", "c2"), ("o", "o2")), verdict(t2, ("c", "c2"), ("o", "o2"))
    assert one.floor == pytest.approx(0.015, abs=1e-3) and both.floor == pytest.approx(0.005)  # MIN_FLOOR
    # the comparison keeps its balance (one early and one late session a side); what is left of the order is what
    # positions 1 and 4 differ from 2 and 3 by, the same either way
    assert one.ratio.median == pytest.approx(0.9 / ((1.01 + 0.98) / 2), abs=1e-9)
    assert both.ratio.median == pytest.approx(0.9 / np.sqrt(1.01 * 0.98), abs=1e-9)


def test_the_second_generation_runs_its_sessions_in_the_reversed_places(monkeypatch):
    """A session's place in the passes has an offset of its own (silero: a generation's A/A contrast centred
    1.01-1.03 made the other way round with the places kept): the second generation runs A2 B2 B A's design."""
    clock = _fake_clock(monkeypatch)
    calls: list[tuple[bool, str]] = []
    labels = ["o", "c", "c2", "o2"]

    class S(_Clocked):
        def __init__(self, label, gen):
            super().__init__(clock, [1e-3])
            self.label, self.gen = label, gen

        def run(self, _out, _feeds):
            calls.append((self.gen, self.label))
            super().run(_out, _feeds)

    T.in_generations(lambda reverse: {k: S(k, reverse) for k in labels}, [(1.0, {})], estimator=WALL, min_runs=8,
                     round_s=4e-3)
    first, second = ([k for g, k in calls if g == gen][4:12] for gen in (False, True))  # after the warm-up
    design = [x for p in T.pass_orders(4) for x in p][:8]
    assert first == [labels[x] for x in design] and second == [labels[::-1][x] for x in design]


def test_a_comparison_in_generations_that_cannot_fit_both_before_the_hard_deadline_does_not_start(monkeypatch):
    """The floor of rounds is planned for both generations, and the second generation's sessions as well: a
    comparison whose first generation fits but not the second raises OutOfBudget before it times anything."""
    clock = _fake_clock(monkeypatch)

    def open_sessions(_reverse: bool) -> dict:
        clock[0] += 0.05  # making four sessions: 50 ms
        return {k: _Clocked(clock, [1e-3]) for k in ("o", "c", "c2", "o2")}

    # a round: 4 sessions x 5 runs of 1 ms = 20 ms; 8 rounds a generation = 0.16 s; both and the sessions: ~0.42 s
    with pytest.raises(T.OutOfBudget):
        T.in_generations(open_sessions, [(1.0, {})], estimator=WALL, min_runs=8, hard_deadline=0.3, round_s=0.01)
    clock[0] = 0.0
    t = T.in_generations(open_sessions, [(1.0, {})], estimator=WALL, min_runs=8, hard_deadline=0.6, round_s=0.01)
    assert t.rounds() == 8 and clock[0] < 0.6


def test_a_comparison_in_generations_takes_the_runs_of_one_and_makes_large_sessions_once(monkeypatch):
    """The two generations share out the runs one would take: a short model's rounds hold half the runs each, a
    model whose round is one run takes half the rounds in each. Sessions that take longer than REMAKE_S to make
    (a large model's) are made once, as they would cost more than the runs."""
    clock = _fake_clock(monkeypatch)
    made = []
    MS = 2.0**-10  # about a millisecond, exact in binary (the rounds' runs are counted from sums of it)

    def maker(cost_s: float, run_s: float):
        def open_sessions(reverse: bool) -> dict:
            made.append(reverse)
            clock[0] += cost_s
            return {k: _Clocked(clock, [run_s]) for k in ("o", "c", "c2", "o2")}
        return open_sessions

    short = T.in_generations(maker(0.125, MS), [(1.0, {})], estimator=WALL, min_runs=20, round_s=20 * MS,
                             keep_runs=True)
    assert made == [False, True] and short.rounds() == 20 and len(short.single_runs("o")) == 20 * 20
    made.clear()
    long = T.in_generations(maker(0.125, 32 * MS), [(1.0, {})], estimator=WALL, min_runs=20, round_s=20 * MS,
                            keep_runs=True)
    assert made == [False, True] and long.rounds() == 10 and len(long.single_runs("o")) == 20
    made.clear()
    large = T.in_generations(maker(T.REMAKE_S + 0.5, MS), [(1.0, {})], estimator=WALL, min_runs=20,
                             round_s=20 * MS, keep_runs=True)
    assert made == [False] and large.rounds() == 20 and len(large.single_runs("o")) == 20 * 20


def test_a_whole_model_round_is_the_median_of_three_runs_where_three_fit_in_a_round(monkeypatch):
    """A round of a whole-model comparison holds MEDIAN_OF runs of each session at least where they fit in the
    round: the median passes over a run that something else slowed (the mean of two, the median of two, carries
    half of it into the round); a model whose three runs do not fit keeps its one run."""
    clock = _fake_clock(monkeypatch)
    MS = 2.0**-10

    def maker(costs):
        return lambda _reverse: {k: _Clocked(clock, costs) for k in ("o", "c", "c2", "o2")}

    # 6 ms runs, a 20 ms round (10 ms in each generation: one run by the share alone); every third run 10x slower
    spiked = T.in_generations(maker([6 * MS, 6 * MS, 60 * MS]), [(1.0, {})], estimator=WALL, min_runs=8,
                              round_s=20 * MS, keep_runs=True)
    assert len(spiked.single_runs("o")) == T.GENERATIONS * 3 * spiked.rounds()  # three runs a round
    assert spiked["o"] == pytest.approx([6 * MS] * spiked.rounds())  # the slowed run is not in any round
    long = T.in_generations(maker([8 * MS]), [(1.0, {})], estimator=WALL, min_runs=8, round_s=20 * MS,
                            keep_runs=True)
    assert len(long.single_runs("o")) == T.GENERATIONS * long.rounds()  # 3 x 8 ms do not fit in 20 ms: one run a round
    # the budget's planning reads the same rule (both generations' runs of one session in one round)
    assert T.model_round_s(0.02) == pytest.approx(T.GENERATIONS * T.MEDIAN_OF * 0.02)
    assert T.model_round_s(0.04) == T.MODEL_ROUND_S and T.model_round_s(0.3) == 0.3


def test_a_comparison_in_generations_runs_on_while_undecided_within_its_seconds_at_most(monkeypatch):
    """`settled` is asked of the first generation: an undecided comparison runs on past `min_seconds`, up to
    `max_seconds` of rounds in all (the sessions' making not counted), and the second generation takes as many
    rounds; a clear one stops at the minimum."""
    clock = _fake_clock(monkeypatch)
    MS = 2.0**-10

    def open_sessions(_reverse: bool) -> dict:
        clock[0] += 0.5  # making the sessions: not part of max_seconds
        return {k: _Clocked(clock, [8 * MS]) for k in ("o", "c", "c2", "o2")}

    def timed(settled):
        start = clock[0]
        t = T.in_generations(open_sessions, [(1.0, {})], estimator=WALL, min_runs=8, min_seconds=1.0,
                             max_seconds=3.0, settled=settled, round_s=20 * MS)
        return t, clock[0] - start - 2 * 0.5

    clear, clear_s = timed(lambda t: True)
    undecided, undecided_s = timed(lambda t: False)
    assert clear_s == pytest.approx(1.0, abs=0.1)  # the minimum of seconds
    assert undecided_s == pytest.approx(3.0, abs=0.1) and undecided.rounds() > 2.5 * clear.rounds()
