"""The one timing loop: sessions interleaved run by run over the shape profiles, each run timed on both clocks
(wall and this thread's CPU time, clock.py); a floor of rounds, then on while the deadline allows until the
minimum of rounds and seconds, and, given `settled`, until the verdict no longer depends on noise. A round of a
short model is several passes over the sessions in a cycle of orders where no session runs twice in a row
(pass_orders); a session's time in it is the median of its runs, pass-normalized (round_times). The measurements
behind each choice: docs/measured-selection.md, "How it times"."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from .clock import CPU, WALL, now
from .stats import profile_scale

__all__ = ["GENERATIONS", "MAX_RUNS", "MIN_RUNS_FLOOR", "MODEL_ROUND_S", "REMAKE_S", "Filtered", "OutOfBudget",
           "Progress", "Timings", "generations", "in_generations", "interleave", "model_round_s", "pass_orders",
           "round_times", "run_times", "warm_up"]

Progress = Callable[[str, float], None]  # (what, fraction done)
MIN_RUNS_FLOOR = 8  # never fewer rounds: a verdict on fewer is not one (chosen, not measured)
MAX_RUNS = 400  # rounds at most (about 1 s of a 2.5 ms model's rounds: see COMPARE_MIN_S in select/region_run.py)
SETTLE_EVERY = 5  # rounds between checks of `settled` at least (a bootstrap each; then a quarter of the rounds)
CLOCKS = (WALL, CPU)
ROUND_S = 2e-3  # a session's share of a round at least, in runs of a short model (a region)
MODEL_ROUND_S = 0.1  # the same in whole-model comparisons (about 25 runs of a 3-4 ms model): every core busy,
# the A/A contrast's p10-p90 was 0.979-1.005 (vit_tiny) with 100 ms rounds, 0.972-1.012 with 40 ms
MAX_REPEAT = 400  # runs per session and round at most (a bound for sub-microsecond regions, not measured)
MEDIAN_OF = 3  # whole-model rounds hold this many runs of each session at least where they fit in MODEL_ROUND_S:
# ppocr_det_v4, every core busy, A/A p10-p90 at worst 0.986-1.014 with the median of 3, 0.961-1.039 with one run
GENERATIONS = 2  # whole-model comparisons: sessions made twice, the second time in the opposite order
REMAKE_S = 1.0  # ... where making them takes at most this long (about the fewest seconds of runs a comparison
# takes: a large model's sessions would cost more than its runs)


@dataclass
class Timings(Mapping):
    """Per-round seconds of each session (labels) on both clocks; as a mapping, the estimator's. With several shape
    profiles a round's time is the weighted sum of each profile's time relative to the first session's median there
    (profile_scale); `raw` keeps each profile's own seconds per round by (clock, label, profile), `runs` every run."""

    estimator: str
    clocks: dict[str, dict[str, list[float]]]
    raw: dict[tuple[str, str, int], list[float]] = field(default_factory=dict)
    runs: dict[tuple[str, str, int], list[float]] = field(default_factory=dict)  # every run, not per round

    def __getitem__(self, label: str) -> list[float]:
        return self.clocks[self.estimator][label]

    def __iter__(self) -> Iterator[str]:
        return iter(self.clocks[self.estimator])

    def __len__(self) -> int:
        return len(self.clocks[self.estimator])

    def on(self, clock: str) -> dict[str, list[float]]:
        return self.clocks[clock]

    def read_on(self, clock: str) -> Timings:
        """The same timings, read on another clock."""
        return Timings(clock, self.clocks, self.raw, self.runs)

    def profile(self, label: str, p: int, clock: str | None = None) -> list[float]:
        return self.raw[clock or self.estimator, label, p]

    def rounds(self) -> int:
        return len(next(iter(self.clocks[self.estimator].values()), []))

    def paired(self, other: Timings) -> Timings:
        """Round i of these and of `other` (the sessions made again, in_generations) as one round: each session's time
        the geometric mean of its two; single runs are both generations'."""
        def both(a: list[float], b: list[float]) -> list[float]:
            return [float(np.sqrt(x * y)) for x, y in zip(a, b, strict=True)]

        clocks = {c: {k: both(v, other.clocks[c][k]) for k, v in ks.items()} for c, ks in self.clocks.items()}
        return Timings(self.estimator, clocks, {key: both(v, other.raw[key]) for key, v in self.raw.items()},
                       {key: v + other.runs.get(key, []) for key, v in self.runs.items()})

    def single_runs(self, label: str, p: int = 0, clock: str | None = None) -> list[float]:
        """Every run's seconds of one session on one profile (the rounds' own times where none were kept)."""
        key = (clock or self.estimator, label, p)
        return self.runs.get(key) or self.raw[key]

    @classmethod
    def of(cls, times: dict[str, list[float]], estimator: str = WALL, profiles: int = 1) -> Timings:
        """Timings whose clocks agree (a test's fake timings, one profile's times repeated per profile)."""
        raw = {(c, k, p): list(v) for c in CLOCKS for k, v in times.items() for p in range(profiles)}
        return cls(estimator, {c: {k: list(v) for k, v in times.items()} for c in CLOCKS}, raw, {})


class Filtered:
    """A session that takes a superset of its inputs (regions' two versions read different values)."""

    def __init__(self, session) -> None:
        self.session = session
        self.names = [i.name for i in session.get_inputs()]

    def run(self, _outputs, feeds: dict) -> list:
        return self.session.run(None, {k: feeds[k] for k in self.names})


class OutOfBudget(Exception):
    """Not even the floor of rounds fits before the end of the budget."""


def interleave(sessions: Mapping[str, object], profiles: list[tuple[float, dict]], *, estimator: str,
               min_runs: int, deadline: float = float("inf"), hard_deadline: float | None = None,
               min_seconds: float = 0.0, floor_runs: int = MIN_RUNS_FLOOR, max_runs: int = MAX_RUNS,
               settled: Callable[[Timings], bool] | None = None, progress: Progress | None = None,
               repeat: int | None = None, round_s: float = ROUND_S, keep_runs: bool = False,
               runs_each: int = 0, generations: int = 1, after_s: float = 0.0, median_of: tuple[int, float] = (1, 0.0),
               clock: Callable[[], float] | None = None) -> Timings:
    """Time `sessions` (label -> anything with `run(None, feeds)`) interleaved over `profiles` ((weight, feeds) each)
    after one warm-up run of each: `floor_runs` rounds at least, then, while `deadline` allows and up to `max_runs`,
    until `min_runs` rounds and `min_seconds` are done and `settled(timings)` (checked every SETTLE_EVERY rounds or
    more) says the verdict is clear. OutOfBudget where the floor would end past `hard_deadline`. A round runs each
    session `repeat` times (default: as many as fit in `round_s`, at least `median_of` = (n, seconds) where n runs fit
    in those seconds) in pass_orders. `keep_runs`: every run's seconds too (Timings.runs); `runs_each`: that many
    single runs at least; `generations` > 1: the first generation of in_generations, `after_s` of work between them.
    Deadlines are read on `clock` (budget.py), the result on `estimator`."""
    clock = clock or time.perf_counter
    order, first = list(sessions), _warm_up(sessions, profiles, clock)
    warm = clock()
    reps, floor_runs, min_runs = _plan_rounds(first, repeat, round_s, median_of, generations, floor_runs,
                                              min_runs, runs_each)
    # a round: reps runs of each session per profile, each about as long as the fastest first run there
    round_est = len(order) * sum(r * f for r, f in zip(reps, first, strict=True))
    if hard_deadline is not None and warm + round_est * floor_runs * generations + after_s > hard_deadline:
        raise OutOfBudget
    raw: dict[tuple[str, str, int], list[float]] = {(c, k, p): [] for c in CLOCKS for k in order
                                                    for p in range(len(profiles))}
    singles: dict[tuple[str, str, int], list[float]] = {key: [] for key in raw}
    i = 0
    start = clock()
    clear = False
    next_check = 0

    def more() -> bool:
        nonlocal clear, next_check
        if i < floor_runs:
            return True
        t = clock()
        if t >= deadline or i >= max_runs:
            return False
        if i < min_runs or t - start < min_seconds:
            return True
        if settled is None:
            return False
        if not clear and i >= next_check:  # checks at geometric intervals: each is a bootstrap over i rounds
            next_check = i + max(SETTLE_EVERY, i // 4)
            clear = settled(_totals(estimator, raw, order, profiles, i))
        return not clear

    cycle = pass_orders(len(order))
    passes = 0  # the design's passes run on across rounds and profiles
    while more():
        for p, (_, feeds) in enumerate(profiles):
            runs = _passes(sessions, order, feeds, [cycle[(passes + j) % len(cycle)] for j in range(reps[p])])
            passes += reps[p]
            for c, by_session in runs.items():
                for k, t in round_times(by_session).items():
                    raw[c, k, p].append(t)
                    if keep_runs:
                        singles[c, k, p].extend(by_session[k])
        i += 1
        if progress is not None and i % 10 == 0:
            done = max(i / min_runs if i < min_runs else 0,
                       (clock() - start) / min_seconds if min_seconds else 1.0)
            progress("timing", min(done, 1.0))
    out = _totals(estimator, raw, order, profiles, i)
    if keep_runs:
        out.runs = singles
    return out


def _plan_rounds(first: list[float], repeat: int | None, round_s: float, median_of: tuple[int, float],
                 generations: int, floor_runs: int, min_runs: int, runs_each: int) -> tuple[list[int], int, int]:
    """Runs of each session per round and profile, and the floor and minimum of rounds (interleave's rules)."""
    # a round of a short model is several interleaved passes (a tenth of a millisecond is shorter than a
    # scheduler's time slice, a few milliseconds are not)
    reps = [repeat or max(1, min(MAX_REPEAT, int(round_s / max(f, 1e-9)))) for f in first]
    if repeat is None:
        reps = [max(r, median_of[0]) if median_of[0] * f <= median_of[1] else r for r, f in zip(reps, first, strict=True)]
    if generations > 1 and all(round_s * generations < 2 * f for f in first):  # the whole round holds one run
        # and a round can hold no fewer: fewer rounds each
        floor_runs, min_runs = -(-floor_runs // generations), -(-min_runs // generations)
    if runs_each:  # single runs asked for: the rounds that hold them (a round holds reps[0] runs of each)
        need = -(-runs_each // reps[0])
        floor_runs, min_runs = max(floor_runs, need), max(min_runs, need)
    return reps, floor_runs, min_runs


def _warm_up(sessions: Mapping[str, object], profiles: list[tuple[float, dict]], clock: Callable[[], float]
             ) -> list[float]:
    """One run of each session on each profile; the fastest run per profile, on `clock`."""
    first = [float("inf")] * len(profiles)
    for s in sessions.values():
        for p, (_, feeds) in enumerate(profiles):
            t = clock()
            s.run(None, feeds)
            first[p] = min(first[p], clock() - t)
    return first


def _passes(sessions: Mapping[str, object], order: list[str], feeds: dict, seqs: list[tuple[int, ...]]
            ) -> dict[str, dict[str, list[float]]]:
    """One round's passes (one run of each session per pass, in the orders `seqs`), each run on both clocks."""
    runs: dict[str, dict[str, list[float]]] = {c: {k: [] for k in order} for c in CLOCKS}
    for seq in seqs:
        for k in (order[x] for x in seq):
            w, c = now()
            sessions[k].run(None, feeds)
            w2, c2 = now()
            runs[WALL][k].append(w2 - w)
            runs[CPU][k].append(c2 - c)
    return runs


def in_generations(open_sessions: Callable[[bool], Mapping[str, object]], profiles: list[tuple[float, dict]], *,
                   estimator: str, min_runs: int, deadline: float = float("inf"), hard_deadline: float | None = None,
                   min_seconds: float = 0.0, floor_runs: int = MIN_RUNS_FLOOR, max_runs: int = MAX_RUNS,
                   progress: Progress | None = None, round_s: float = MODEL_ROUND_S, keep_runs: bool = False,
                   runs_each: int = 0, settled: Callable[[Timings], bool] | None = None,
                   max_seconds: float = float("inf"), clock: Callable[[], float] | None = None) -> Timings:
    """A whole-model comparison in GENERATIONS of sessions: `open_sessions(False)` makes them (A B B2 A2) and they
    are timed (interleave) for half of `round_s` a round (or, where a round is one run, half of the rounds), within
    half of what is left before `deadline` and of `max_seconds`; they are deleted, `open_sessions(True)` makes them
    again in the opposite order (A2 B2 B A) and these are timed, places in the passes reversed, for as many rounds.
    Round i of each generation is one round (Timings.paired). `settled` is asked of the first generation. Sessions
    that took longer than REMAKE_S to make are made once (generations()). Why: a session's offset follows the order
    it was made in, and making them again the other way cancels it in the A/A contrast and the floor
    (docs/measured-selection.md, "Sessions")."""
    clock = clock or time.perf_counter
    t = clock()
    sessions = open_sessions(False)
    made = clock() - t
    n_gen = generations(made)
    if n_gen == 1:
        out = interleave(sessions, profiles, estimator=estimator, min_runs=min_runs, floor_runs=floor_runs,
                         deadline=min(deadline, clock() + max_seconds), hard_deadline=hard_deadline, min_seconds=min_seconds,
                         max_runs=max_runs, progress=progress, round_s=round_s, keep_runs=keep_runs,
                         runs_each=runs_each, median_of=(MEDIAN_OF, round_s), settled=settled, clock=clock)
        del sessions
        return out
    start = clock()
    share = 1 / n_gen

    def part(g: int) -> Progress | None:
        return None if progress is None else (lambda what, f: progress(what, (g + f) * share))

    first = interleave(sessions, profiles, estimator=estimator, min_runs=min_runs, floor_runs=floor_runs,
                       deadline=start + min(deadline - start - made, max_seconds) * share, hard_deadline=hard_deadline,
                       min_seconds=min_seconds * share, max_runs=max_runs, progress=part(0),
                       round_s=round_s * share, keep_runs=keep_runs, runs_each=-(-runs_each // n_gen),
                       generations=n_gen, after_s=made, median_of=(MEDIAN_OF, round_s), settled=settled,
                       clock=clock)
    del sessions
    n = first.rounds()
    sessions = open_sessions(True)
    second = interleave(dict(reversed(list(sessions.items()))), profiles, estimator=estimator, min_runs=n, floor_runs=n, max_runs=n,
                        hard_deadline=hard_deadline, progress=part(1), round_s=round_s * share,
                        keep_runs=keep_runs, median_of=(MEDIAN_OF, round_s), clock=clock)
    del sessions
    return first.paired(second)


def generations(sessions_s: float) -> int:
    """How many generations of sessions a whole-model comparison makes (in_generations), for sessions that take
    `sessions_s` to make: GENERATIONS where that is at most REMAKE_S, else one."""
    return GENERATIONS if sessions_s <= REMAKE_S else 1


def pass_orders(n: int) -> list[tuple[int, ...]]:
    """The orders of a cycle of passes over `n` sessions (indices): no session runs twice in a row, not even from one
    pass to the next (a session run right after itself finds its weights in the cache), each follows each other
    one equally often and holds each place equally often (a Williams design: n passes for an even n, 2n for an odd
    one; docs/measured-selection.md, "One loop"). Two sessions alternate (A B A B); one runs alone."""
    if n <= 2:
        return [tuple(range(n))]
    first = [0]  # 0, 1, n-1, 2, n-2, ...: the differences between neighbours are all different
    lo, hi = 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [tuple((x + r) % n for x in first) for r in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]  # an odd n balances the successions with the mirrored rows
    return _chain(rows)


def _chain(rows: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """`rows` in a cyclic order where no row starts with the session the one before it ended with (a search:
    the rows are few)."""
    def extend(path: list[int]) -> list[int] | None:
        if len(path) == len(rows):
            return path if rows[path[-1]][-1] != rows[path[0]][0] else None
        for j in range(len(rows)):
            if j not in path and rows[j][0] != rows[path[-1]][-1]:
                found = extend([*path, j])
                if found:
                    return found
        return None
    found = extend([0])
    assert found is not None, "no order of the passes without a repeat"
    return [rows[j] for j in found]


def model_round_s(run_s: float) -> float:
    """About the seconds of runs of one session in one round of a whole-model comparison, both generations, for a
    model whose run takes `run_s`: MODEL_ROUND_S, or MEDIAN_OF runs per generation where they fit, or one run."""
    median = GENERATIONS * MEDIAN_OF * run_s if MEDIAN_OF * run_s <= MODEL_ROUND_S else 0.0
    return max(run_s, MODEL_ROUND_S, median)


def round_times(runs: Mapping[str, list[float]]) -> dict[str, float]:
    """Each session's time in a round from its runs there (one per pass): the median of its runs, each divided by its
    pass's geometric mean over the sessions, times the median of those means. Runs of one pass share the machine's
    slow moments, which the division removes; ratios within a pass are unchanged. One session: the median of its
    runs. (bert_tiny, 4 sessions, while 2 processes streamed 64 MB copies: A/A p10-p90 half-width 2.8% with the plain
    median, 2.1% pass-normalized.)"""
    labels = list(runs)
    m = np.maximum(np.asarray([runs[k] for k in labels], dtype=np.float64), 1e-12)  # sessions x passes
    g = np.exp(np.log(m).mean(axis=0))
    scaled = np.median(m / g, axis=1) * np.median(g)
    return {k: float(v) for k, v in zip(labels, scaled, strict=True)}


def _totals(estimator: str, raw: dict[tuple[str, str, int], list[float]], order: list[str],
            profiles: list[tuple[float, dict]], n: int) -> Timings:
    clocks = {}
    for c in CLOCKS:
        scale = [profile_scale(w, raw[c, order[0], p][:n], len(profiles) > 1) for p, (w, _) in enumerate(profiles)]
        clocks[c] = {k: [sum(scale[p] * raw[c, k, p][r] for p in range(len(profiles))) for r in range(n)]
                     for k in order}
    return Timings(estimator, clocks, {key: list(v[:n]) for key, v in raw.items()})


def run_times(session, feeds: dict, runs: int, warmup: int = 0) -> list[float]:
    """Wall seconds per run of one session, after `warmup` untimed runs (peaks and probes, not comparisons)."""
    for _ in range(warmup):
        session.run(None, feeds)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, feeds)
        ts.append(time.perf_counter() - t)
    return ts


def warm_up(session, feeds: dict, max_runs: int = 200) -> int:
    """Runs in blocks of 10 until two consecutive block medians agree within 5%; returns the runs taken."""
    previous = None
    for block in range(max_runs // 10):
        med = float(np.median(run_times(session, feeds, 10)))
        if previous is not None and abs(med - previous) <= 0.05 * previous:
            return (block + 1) * 10
        previous = med
    return max_runs
