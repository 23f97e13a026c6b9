"""The test suite with every core busy: the condition under which a test that asserts what real timing decides
fails (a second test suite beside it, a loaded CI machine).

    python -m benchmarks.busy_suite                      # the whole suite, one busy loop per core
    python -m benchmarks.busy_suite tests/test_regions.py -k cached --repeat 5
    python -m benchmarks.busy_suite --busy 4 --seconds 600 -- tests/test_provenance.py
    python -m benchmarks.busy_suite --ci --repeat 2       # CI itself: .ci/run on a fresh clone of HEAD, twice

Starts N busy-loop processes (default: one per core this process may use), runs
`python -m pytest -q -p no:cacheprovider [ARGS]` (ARGS: test files, -k, ...) `--repeat` times, and prints each
run's result (exit code and pytest's summary line) and wall time, then the counts. Each busy loop stops by itself
after `--seconds` (default 1800 per run, 3600 per run with `--ci`) or when this script's process is gone, and is killed when the script exits
(normally, on an error, on Ctrl-C or SIGTERM), so none is left spinning.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# one busy loop: spins until its deadline, or until its parent (this script) is gone
SPIN = """
import os, sys, time
end, parent = time.monotonic() + float(sys.argv[1]), os.getppid()
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(200000):
        pass
"""


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def start_busy(n: int, seconds: float) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN, str(seconds)], stdin=subprocess.DEVNULL)
            for _ in range(n)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def run_suite(args: list[str]) -> tuple[int, str, float]:
    """(exit code, pytest's last line, wall seconds); pytest's output is passed through as it comes."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    t0 = time.perf_counter()
    last = ""
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        assert p.stdout is not None
        for line in p.stdout:
            sys.stdout.write(line)
            if line.strip():
                last = line.strip()
        rc = p.wait()
    return rc, last, time.perf_counter() - t0


def run_ci() -> tuple[int, str, float]:
    """.ci/run on a fresh clone of this checkout's HEAD (what CI runs: committed files only, a new venv, no
    cache): (exit code, its last line, wall seconds). The clone is removed afterwards."""
    import shutil
    import tempfile
    folder = tempfile.mkdtemp(prefix="busy-ci-")
    try:
        subprocess.run(["git", "clone", "-q", ROOT, os.path.join(folder, "repo")], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "ONNXFUSE_CACHE_DIR")}
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                      if not p.startswith(os.path.join(ROOT, ".venv")))
        t0 = time.perf_counter()
        last = ""
        with subprocess.Popen(["bash", ".ci/run"], cwd=os.path.join(folder, "repo"), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
            assert p.stdout is not None
            for line in p.stdout:
                sys.stdout.write(line)
                if line.strip():
                    last = line.strip()
            rc = p.wait()
        return rc, last, time.perf_counter() - t0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    after = argv[argv.index("--") + 1:] if "--" in argv else []  # all for pytest
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", type=int, default=cores(), help="busy-loop processes (default: one per core)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="each busy loop stops by itself after this many seconds (default 1800 per run, "
                         "3600 per run with --ci)")
    ap.add_argument("--repeat", type=int, default=1, help="run the tests this many times (default 1)")
    ap.add_argument("--ci", action="store_true", help="run .ci/run on a fresh clone of HEAD instead of pytest here")
    ns, rest = ap.parse_known_args(argv)  # the rest, and all after "--", is pytest's (files, -k EXPR, ...)
    pytest_args = rest + after
    if ns.seconds is None:
        ns.seconds = (3600.0 if ns.ci else 1800.0) * max(ns.repeat, 1)
    if ns.busy < 0 or ns.repeat < 1 or ns.seconds <= 0:
        ap.error("--busy >= 0, --repeat >= 1, --seconds > 0")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(signum)
    signal.signal(signal.SIGTERM, on_signal)

    busy = start_busy(ns.busy, ns.seconds)
    results = []
    try:
        for k in range(ns.repeat):
            rc, last, wall = run_ci() if ns.ci else run_suite(pytest_args)
            results.append(rc)
            alive = sum(p.poll() is None for p in busy)
            print(f"busy_suite: run {k + 1}/{ns.repeat}: {'passed' if rc == 0 else 'FAILED'} (exit {rc}): {last}; "
                  f"wall {wall:.1f} s with {alive} of {ns.busy} busy loop(s) still running, "
                  f"load average {os.getloadavg()[0]:.1f} on {cores()} core(s)", flush=True)
    except KeyboardInterrupt:
        print("busy_suite: interrupted", file=sys.stderr)
        return 130
    finally:
        stop_busy(busy)
    failed = sum(rc != 0 for rc in results)
    print(f"busy_suite: {len(results) - failed} of {len(results)} run(s) passed, {failed} failed "
          f"({'.ci/run on fresh clones' if ns.ci else ' '.join(map(str, pytest_args)) or 'the whole suite'}; {ns.busy} busy loop(s))")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
