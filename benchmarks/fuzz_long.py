"""Long fuzz run: the property-based test of tests/test_fuzz.py with many more examples, and a tally of the
rules the random graphs made fire.

    python benchmarks/fuzz_long.py [EXAMPLES]      (default 1000)
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from fuzz_graphs import random_model  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from test_fuzz import check_invariants  # noqa: E402


def main() -> int:
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    fired: collections.Counter = collections.Counter()
    count = [0]

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(random_model())
    def run(case):
        model, feeds = case
        with tempfile.TemporaryDirectory() as tmp:
            fired.update(check_invariants(model, feeds, tmp))
        count[0] += 1

    t = time.perf_counter()
    run()
    print(f"{count[0]} random graphs, all invariants held, {time.perf_counter() - t:.1f} s")
    for rule, n in fired.most_common():
        print(f"  {rule:24s} fired {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
