"""The computed-constant language cannot run arbitrary code or exhaust memory; YAML is loaded safely."""

import numpy as np
import pytest

from onnxfuse.patterns.compute import ComputeError, Env, compile_expr, evaluate
from onnxfuse.patterns.syntax import SyntaxProblem

ATTACKS = [
    "__import__('os').system('true')",
    "W.__class__",
    "W.value.__class__.__mro__",
    "(lambda: 1)()",
    "[x for x in W]",
    "eval('1')",
    "exec('x=1')",
    "open('/etc/passwd')",
    "getattr(W, 'shape')",
    "().__class__.__bases__",
    "{'a': 1}",
    "f'{W}'",
    "W if (W := 1) else 2",
    "globals()",
    "reshape.__globals__",
]


@pytest.mark.parametrize("text", ATTACKS)
def test_rejected_when_compiled(text):
    with pytest.raises(SyntaxProblem):
        compile_expr(text)


def _env(**values):
    return Env(lambda n: values[n], lambda n, f: getattr(np.asarray(values[n]), f))


@pytest.mark.parametrize("text", ["10 ** 10 ** 10", "ones([100000, 100000, 100])", "zeros([-1])"])
def test_resource_bombs_fail_cleanly(text):
    with pytest.raises(ComputeError):
        evaluate(compile_expr(text), _env())


def test_normal_expressions_work():
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = evaluate(compile_expr("reshape(W * 2, [-1]) + 1"), _env(W=w))
    assert out.dtype == np.float32 and out.tolist() == [1, 3, 5, 7, 9, 11]
    assert evaluate(compile_expr("not is_identity_perm([1, 0]) and max(2, 3) == 3"), _env()) is True


def test_float64_internally_stored_in_input_dtype():
    s = np.array([1e-8], np.float32)
    out = evaluate(compile_expr("S / sqrt(S + 1.0)"), _env(S=s))
    assert out.dtype == np.float32
