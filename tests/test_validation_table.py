"""The validation table says which tolerance decided each output: `pass (atol)` or `pass (rtol)` (the larger term
of atol + rtol * |original| where the output came closest to its bound), with a footnote; --json has
`decided_by`."""

from __future__ import annotations

import json

import numpy as np
import onnx.helper as oh
import pytest
from conftest import make_model, save

from onnxfuse.validate.compare import compare_one


def _erf_gelu(tmp_path) -> str:
    """x * 0.5 * (1 + erf(x / sqrt2)): fused into com.microsoft.Gelu, whose outputs differ in the last bits."""
    nodes = [oh.make_node("Div", ["x", "sqrt2"], ["d"], name="div"), oh.make_node("Erf", ["d"], ["e"], name="erf"),
             oh.make_node("Add", ["e", "one"], ["p"], name="add"),
             oh.make_node("Mul", ["x", "half"], ["xh"], name="mul_half"),
             oh.make_node("Mul", ["xh", "p"], ["y"], name="gelu_out")]
    consts = {"sqrt2": np.array(1.4142135, "float32"), "one": np.array(1.0, "float32"),
              "half": np.array(0.5, "float32")}
    return save(make_model(nodes, [("x", [2, 8])], [("y", [2, 8])], consts), tmp_path / "g.onnx")


@pytest.mark.parametrize(("flags", "decided"), [(("--rtol", "0"), "atol"), (("--atol", "0", "--rtol", "1e-3"), "rtol")])
def test_the_row_says_which_tolerance_decided(cli, tmp_path, flags, decided):
    src = _erf_gelu(tmp_path)
    code, stdout, stderr = cli("optimize", src, tmp_path / "o.onnx", "--json", *flags)
    assert code == 0, stderr
    (check,) = json.loads(stdout)["validation"]["outputs"]
    assert check["max_abs"] > 0 and check["passed"] and check["decided_by"] == decided
    code, stdout, _ = cli("optimize", src, tmp_path / "o.onnx", *flags)
    assert code == 0
    (row,) = [ln for ln in stdout.splitlines() if ln.startswith("│ y ")]
    assert row.rstrip(" │").endswith(f"pass ({decided})")
    assert "ok: each element must be within atol + rtol * |original|" in stdout


def test_decided_by_in_the_comparison():
    ref = np.array([0.0, 1e-3, 100.0], "float32")
    near_zero = ref + np.array([5e-5, 0, 0], "float32")  # its bound there is atol
    large = ref + np.array([0, 0, 5e-3], "float32")  # rtol * 100 = 1e-2 > atol
    assert compare_one("y", ref, near_zero).decided_by == "atol"
    assert compare_one("y", ref, large).decided_by == "rtol"
    assert compare_one("y", ref, ref.copy()).decided_by == "equal"
    assert compare_one("i", np.arange(3), np.arange(3)).decided_by == "exact"
    words = np.array(["a", "b", "c"])
    assert compare_one("s", words, np.array(["a", "x", "c"])).note == "1 element differs"
    assert compare_one("s", words, np.array(["a", "x", "y"])).note == "2 elements differ"
