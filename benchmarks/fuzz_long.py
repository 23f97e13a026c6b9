"""Long fuzz run: the property-based test of tests/test_fuzz.py with many more examples and a fresh seed each
run (the test suite itself is derandomized), and a tally of the rules the random graphs made fire.

    python -m benchmarks.fuzz_long [EXAMPLES] [--seed N]      (default 1000 examples, a random seed)

The seed is printed first; `--seed N` repeats a run. A failure found here becomes a fixed regression test in
tests/test_fuzz.py (build the graph with corpora/fuzz_graphs.py's helpers, as layernorm_chain does).
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

from corpora.fuzz_graphs import random_model

# this runs tests/test_fuzz.py's own property with more examples: its invariants, imported from the test (which
# imports conftest.py beside it)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_fuzz import WELL_CONDITIONED, check_invariants, conditioning  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("examples", nargs="?", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    run_seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"seed {run_seed} (repeat with --seed {run_seed})", flush=True)
    fired: collections.Counter = collections.Counter()
    count = [0, 0]

    @seed(run_seed)
    @settings(max_examples=args.examples, deadline=None, database=None, derandomize=False, print_blob=True, phases=list(Phase),
              suppress_health_check=list(HealthCheck))
    @given(random_model())
    def run(case):
        model, feeds = case
        with tempfile.TemporaryDirectory() as tmp:
            fired.update(check_invariants(model, feeds, tmp))
        count[0] += 1
        count[1] += conditioning(model, feeds) > WELL_CONDITIONED

    t = time.perf_counter()
    run()
    print(f"{count[0]} random graphs ({count[1]} ill-conditioned: numeric invariants waived), all invariants "
          f"held, {time.perf_counter() - t:.1f} s")
    for rule, n in fired.most_common():
        print(f"  {rule:24s} fired {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
