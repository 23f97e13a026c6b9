#!/usr/bin/env bash
# GPU check of the CUDA target, in one prepared script for a machine with an NVIDIA GPU (the device tool).
#   bash benchmarks/gpu_check.sh [MODELS_DIR] [OUT_DIR]     (defaults: ../shared/models, /tmp/onnxfuse-gpu)
# It installs onnxfuse with onnxruntime-gpu (the same version as the pinned CPU onnxruntime), checks that the
# live CUDA kernel registry agrees with the shipped published table for every op the built-in rules emit,
# optimizes every model with --target cuda (validation then runs on the CUDA execution provider), checks each
# output has no op without a CUDA kernel, and prints a latency table (onnxfuse bench, CUDA EP, original vs
# optimized, interleaved). Prints one line per model; exits non-zero if any step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
MODELS=${1:-../shared/models}
OUT=${2:-/tmp/onnxfuse-gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || { echo "no GPU"; exit 2; }
VENV="$OUT/venv"
python3 -m venv "$VENV" && . "$VENV/bin/activate"
python -m pip install -q --upgrade pip
pip install -q -e . || { echo "could not install onnxfuse"; exit 2; }
ORT_VERSION=$(python -c "import onnxruntime; print(onnxruntime.__version__)")
pip uninstall -q -y onnxruntime && pip install -q "onnxruntime-gpu==$ORT_VERSION" \
  || { echo "could not install onnxruntime-gpu==$ORT_VERSION"; exit 2; }
python - <<'PY' || exit 1
import onnxruntime as ort
from onnxfuse import load_rules
from onnxfuse.targets import kernel_issue, provider_registered, table_source
print("onnxruntime", ort.__version__, ort.get_available_providers())
assert provider_registered("cuda"), "the CUDA execution provider did not register"
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
