"""`--target openvino` end to end, in a venv of its own: onnxruntime-openvino replaces the onnxruntime package, so
it cannot share this one. The venv is built once (cached under ~/.cache/onnxfuse-test-openvino, keyed by the
onnxruntime-openvino version the kernel facts were probed with, and the Python version) and onnxfuse runs there
from this checkout (PYTHONPATH). Skipped, with the reason, when pip cannot install it (no network, no wheel for
this Python)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import onnx
import pytest

from onnxfuse.targets import facts_file, get, kernel_issue

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "transformer_small.onnx"
CACHE = pathlib.Path(os.environ.get("ONNXFUSE_OPENVINO_VENV_CACHE",
                                    pathlib.Path.home() / ".cache" / "onnxfuse-test-openvino"))
FACTS = get("openvino").facts


def _venv_python() -> pathlib.Path:
    source, _ = facts_file(FACTS)
    version = source["onnxruntime"]
    venv = CACHE / f"onnxruntime-openvino-{version}-py{sys.version_info.major}.{sys.version_info.minor}"
    python = venv / "bin" / "python"
    done = venv / ".installed"
    if done.exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot create a venv for onnxruntime-openvino: {made.stderr.strip()[-200:]}")
    pins = [f"onnxruntime-openvino=={version}", f"onnx=={onnx.__version__}", "numpy", "pyyaml", "typer", "rich"]
    try:
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins],
                             capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        pip = None
    if pip is None or pip.returncode:
        shutil.rmtree(venv, ignore_errors=True)
        why = "timed out" if pip is None else (pip.stderr.strip().splitlines() or ["failed"])[-1]
        pytest.skip(f"pip cannot install {' '.join(pins[:2])} into a fresh venv: {why}")
    done.write_text(" ".join(pins) + "\n")
    return python


@pytest.fixture(scope="module")
def ov_python():
    return _venv_python()


def _run(python: pathlib.Path, args: list[str], cwd: pathlib.Path, timeout: float = 120):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ONNXFUSE_CACHE_DIR": str(cwd / "cache")}
    env.pop("ONNXFUSE_CPU_NCHWC", None)
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_facts_are_what_the_provider_claims_now(ov_python, tmp_path):
    """The committed facts are reproduced by probing again: the contrib Gelu erf-gelu makes is claimed, the ONNX
    LayerNormalization layernorm-decomposed makes is refused."""
    out = tmp_path / "facts.json"
    r = _run(ov_python, ["-m", "onnxfuse.inspect.kernel_probe", "openvino", "--rule", "erf-gelu", "--rule",
                         "layernorm-decomposed", "-o", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr
    probed = json.loads(out.read_text())
    committed = json.loads((ROOT / "onnxfuse" / "kernels" / FACTS).read_text())
    provider = get("openvino").provider
    assert probed["source"] == committed["source"]
    assert probed["kernels"][provider] == {"com.microsoft": {"Gelu": committed["kernels"][provider]["com.microsoft"]
                                                            ["Gelu"]}}
    assert set(probed["refused"]) == {"LayerNormalization"}
    assert probed["refused"]["LayerNormalization"] == committed["refused"]["LayerNormalization"]


CHECK = textwrap.dedent("""
    import json, sys
    import numpy as np, onnxruntime as ort
    so = ort.SessionOptions()
    s = ort.InferenceSession(sys.argv[1], so, providers=[("OpenVINOExecutionProvider", {"device_type": "CPU"}),
                                                       "CPUExecutionProvider"])
    feeds = {i.name: np.ones([d if isinstance(d, int) else 2 for d in i.shape], np.int64) for i in s.get_inputs()}
    out = s.run(None, feeds)
    print(json.dumps({"version": ort.__version__, "providers": s.get_providers(),
                      "finite": bool(all(np.isfinite(o).all() for o in out))}))
""")


def test_optimize_for_openvino_validates_and_measures_on_its_provider(ov_python, tmp_path):
    out = tmp_path / "out.onnx"
    r = _run(ov_python, ["-m", "onnxfuse.cli", "optimize", str(MODEL), str(out), "--target", "openvino", "--json",
                         "--no-measure"], tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["target"] == "openvino"
    assert res["validation"]["status"] == "passed"  # not "passed on CPU (...)": the provider was there
    assert res["applications"], "no rule fired on the transformer for openvino"
    made = {op for a in res["applications"] for op in a["ops"]}
    # the rules that make what the facts refuse were skipped, each with the facts' reason
    skipped = {s["rule"]: s["reason"] for s in res["skipped_rules"]}
    assert any("no OpenVINO kernel for" in why and FACTS in why for why in skipped.values())
    # every op the rewrite made is one the provider claimed (the facts), at the model's opset and element type
    model = onnx.load(out)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    assert made
    for qual in made:
        domain, _, op = qual.rpartition(".")
        assert kernel_issue(domain, op, "openvino", onnx.TensorProto.FLOAT, opset) is None, qual
    # it loads on the OpenVINO provider in that venv's onnxruntime and runs
    check = _run(ov_python, ["-c", CHECK, str(out)], tmp_path)
    assert check.returncode == 0, check.stderr
    seen = json.loads(check.stdout)
    assert seen["providers"][0] == "OpenVINOExecutionProvider" and seen["finite"]
    assert seen["version"] == facts_file(FACTS)[0]["onnxruntime"]

    # measured selection times on the provider too (whatever it decides, the report says where it timed)
    measured = tmp_path / "measured.onnx"
    r = _run(ov_python, ["-m", "onnxfuse.cli", "optimize", str(MODEL), str(measured), "--target", "openvino",
                         "--json", "--measure-budget", "3"], tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["validation"]["status"].startswith("passed") and res["measure"]["provider"] == "openvino"
    assert "not measured" not in (res["measure"].get("note") or ""), res["measure"]
