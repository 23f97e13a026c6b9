#!/usr/bin/env bash
# GPU check of the CUDA target, in one prepared script for a machine with an NVIDIA GPU (the device tool).
#   bash benchmarks/gpu_check.sh [MODELS_DIR] [OUT_DIR]     (defaults: ../shared/models, /tmp/onnxfuse-gpu)
# It checks that the live CUDA kernel registry agrees with the shipped published table for every op the built-in
# rules emit, optimizes every model with --target cuda (validation then runs on the CUDA execution provider),
# checks each output has no op without a CUDA kernel, and prints a latency table (onnxfuse bench, CUDA EP,
# original vs optimized, interleaved). One line per model; exits non-zero if any step fails, 2 if it cannot start.
#
# WHAT IT NEEDS, AND WHY IT CANNOT SIMPLY RUN THERE (read before spending device time):
# - The device machine reaches no package registry: nothing can be pip-installed there from PyPI. Every wheel
#   must travel with the working tree, in an ignored folder named in the device tool's `carry`; the tree and
#   the carried paths together are at most 64 MiB per call. This script installs only from WHEELS
#   ($ONNXFUSE_WHEELS, default .gpu-wheels/ at the repo root; add `/.gpu-wheels/` to .git/info/exclude), with
#   `pip install --no-index --find-links`, and never asks a registry.
# - onnxruntime-gpu 1.32.0 (the version of the CPU onnxruntime the project is developed on) does not exist on
#   PyPI; the newest there is 1.31.1, a ~255 MB wheel: too big for one call. The CUDA check then runs on
#   1.31.1 (pyproject allows onnxruntime>=1.18), and its live registry is compared with a table generated from
#   1.32's OperatorKernels.md: a difference may be the version, not a bug.
# - The image holds CUDA 13 and cuDNN. PyPI's onnxruntime-gpu wheels are built for CUDA 12: check
#   `ldconfig -p | grep -E "libcudart.so.12|libcublasLt.so.12"` there first; if the CUDA 12 runtime libraries
#   are absent the CUDA EP will not register (the script stops with "did not register"), and this check needs
#   an onnxruntime-gpu built for CUDA 13, or the CUDA 12 runtime wheels (nvidia-cuda-runtime-cu12,
#   nvidia-cublas-cu12, ...: large too) carried the same way.
# How to carry the 255 MB wheel, on a machine held across calls (files in ignored folders stay between calls
# while the machine is held: at most 30 minutes, and every call costs device time out of 15 minutes):
#   here:   pip download --no-deps -d /tmp/w onnxruntime-gpu==1.31.1
#           pip download -d .gpu-wheels onnx numpy typer rich pyyaml   # pyproject's other dependencies (~40 MB)
#           split -b 60M /tmp/w/onnxruntime_gpu-*.whl .gpu-parts/ort.whl.part-     # 5 parts
#   then one device call per part, each carrying only that part (move the others out of the tree first),
#   appending it to a persisting folder: `mkdir -p /tmp/keep && cat .gpu-parts/ort.whl.part-* >> /tmp/keep/ort.whl`
#   in order aa, ab, ...; the working tree itself travels each time too (a few MiB), so a part and the
#   dependency wheels do not fit one call together except the last, smallest part (~15 MiB). The last call
#   carries .gpu-wheels, moves /tmp/keep/ort.whl into it under the wheel's
#   own file name (pip needs it), checks `sha256sum` against the one computed here, and runs this script.
#   Five or six calls, each with a transfer of ~60 MiB, fit the 30-minute hold only if made back to back; if
#   the machine goes back in between, everything carried so far is lost. Plan that the CUDA check may not be
#   possible in one session, and say so in the report rather than claim it ran.
set -uo pipefail
cd "$(dirname "$0")/.."
MODELS=${1:-../shared/models}
OUT=${2:-/tmp/onnxfuse-gpu}
WHEELS=${ONNXFUSE_WHEELS:-.gpu-wheels}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || { echo "no GPU"; exit 2; }
ls "$WHEELS"/onnxruntime_gpu-*.whl >/dev/null 2>&1 \
  || { echo "no onnxruntime-gpu wheel in $WHEELS (see this script's header: it must be carried)"; exit 2; }
VENV="$OUT/venv"
python3 -m venv "$VENV" && . "$VENV/bin/activate"
PIP="pip install -q --no-index --find-links $WHEELS"
# onnxruntime-gpu does not satisfy the requirement "onnxruntime": install the other dependencies and the GPU
# wheel, then onnxfuse itself with --no-deps (no CPU onnxruntime, which would share and shadow its files)
$PIP onnxruntime-gpu "onnx>=1.16" "numpy>=1.24" "pyyaml>=6" "typer>=0.12" "rich>=13" \
  || { echo "could not install onnxruntime-gpu and the dependencies from $WHEELS"; exit 2; }
$PIP --no-deps --no-build-isolation -e . || { echo "could not install onnxfuse (setuptools in the venv?)"; exit 2; }
python - <<'PY' || exit 1
import onnxruntime as ort
from onnxfuse import load_rules
from onnxfuse.targets import available, kernel_issue, kernel_source, table_source
print("onnxruntime", ort.__version__, ort.get_available_providers())
assert available("cuda"), "the CUDA execution provider is not available"
# one answer: where the provider is available its kernels are read from the live registry, not the table
assert kernel_source("cuda").live, f"CUDA is available but its kernels come from {kernel_source('cuda').label}"
bad = []
for r in load_rules():
    if "cuda" not in r.targets:
        continue
    for domain, op in r.output_ops():
        live = kernel_issue(domain, op, "cuda")
        table = kernel_issue(domain, op, "cuda", source=table_source("cuda"))
        if (live is None) != (table is None):
            bad.append(f"{r.id}: {domain}.{op}: live registry says {live!r}, published table says {table!r}")
print("\n".join(bad) or "kernel table agrees with the live CUDA registry for every op the CUDA rules emit")
PY
status=0
printf '%-28s %-10s %-48s %s\n' model validation fused "bench (optimized / original, CUDA EP)"
for m in "$MODELS"/*.onnx; do
  name=$(basename "$m" .onnx)
  out="$OUT/$name.cuda.onnx"
  if ! onnxfuse optimize "$m" "$out" --target cuda --force --json > "$OUT/$name.json" 2> "$OUT/$name.err"; then
    printf '%-28s FAILED     %s\n' "$name" "$(tail -1 "$OUT/$name.err")"; status=1; continue
  fi
  summary=$(python - "$OUT/$name.json" "$out" <<'PY'
import json, sys, onnx
from onnxfuse.targets import kernel_issue
r = json.load(open(sys.argv[1]))
fused = ",".join(f"{k.split('.')[-1]}x{v}" for k, v in r["ops_after"].items() if k.startswith("com.microsoft"))
m = onnx.load(sys.argv[2], load_external_data=False)
opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
missing = sorted({f"{n.domain}.{n.op_type}" for n in m.graph.node  # the nodes onnxfuse created
                  if n.doc_string.startswith("onnxfuse: rule=") and n.op_type != "Constant"  # an initializer to onnxruntime
                  and kernel_issue(n.domain, n.op_type, "cuda",
                                                                                 opset=opset)})
print(r["validation"]["status"].split(";")[0], fused or "-", ("NO CUDA KERNEL: " + ",".join(missing)) if missing else "")
PY
)
  bench=$(onnxfuse bench "$m" "$out" --provider cuda --runs 50 --json 2>/dev/null \
          | python -c "import json,sys; d=json.load(sys.stdin); r=d.get('ratio') or {}; print(f\"{r.get('median', float('nan')):.3f} [{r.get('low', float('nan')):.3f}, {r.get('high', float('nan')):.3f}] {d.get('verdict', '')}\")" \
          || echo "bench failed")
  printf '%-28s %s  %s\n' "$name" "$summary" "$bench"
  case "$summary" in *"NO CUDA KERNEL"*) status=1 ;; esac
done
exit $status
