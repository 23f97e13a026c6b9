"""The package's import direction (docs/architecture.md): every onnxfuse import, at module level or inside a
function, goes to a module of the same or an earlier stage; no module imports another's private name; no
import cycles. A new module must be given a stage here."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "onnxfuse"
# the stages, in pipeline order (the first part of the module path below onnxfuse; "" is the package itself)
STAGES = [("errors", "files", "cache_folder", "options", "progress", "signals", "words", "ir", "model_proto", "tensors", "opschema", "op_cost", "targets",
           "kernels", "concepts", "patterns", "match"),
          ("inputs", "load"), ("rewrite",), ("regions",), ("validate",), ("measure",), ("select",), ("result",), ("inspect",),
          ("pipeline", "batch", "forkserver_guard", "ir_pass", "fleet", "cli", "")]


def _stage(module: str) -> int:
    head = (module.split(".")[1:] or [""])[0]
    return next(i for i, names in enumerate(STAGES) if head in names)


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        init = parts[-1] == "__init__"
        out[".".join(parts[:-1] if init else parts)] = (p, init)
    return out


MODULES = _modules()


def _imports(module: str) -> tuple[set[str], list[str]]:
    """(onnxfuse modules it imports, private names it imports from other modules)."""
    path, init = MODULES[module]
    package = module if init else module.rsplit(".", 1)[0]
    deps, private = set(), []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (n.level - 1)] if n.level else []
            target = ".".join(base + ([n.module] if n.module else [])) if n.level else (n.module or "")
            for a in n.names:
                dep = f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target
                if dep in MODULES:
                    deps.add(dep)
                    if a.name.startswith("_") and not a.name.startswith("__") and dep != module:
                        private.append(f"{target}.{a.name}")
        elif isinstance(n, ast.Import):
            deps.update(a.name for a in n.names if a.name in MODULES)
    deps.discard(module)
    return deps, private


def test_every_module_has_a_stage():
    for m in MODULES:
        _stage(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_pipeline(module):
    deps, private = _imports(module)
    up = [d for d in deps if _stage(d) > _stage(module) and d != "onnxfuse"]
    assert up == [], f"{module} (stage {_stage(module)}) imports a later stage: {up}"
    assert private == [], f"{module} imports private names: {private}"


def test_no_import_cycles():
    graph = {m: _imports(m)[0] for m in MODULES}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(path[path.index(d):] + [d])}")
            if d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


MAX_MODULE_LINES = 450  # a module past this holds more than one concept: split it by concept
MAX_FUNCTION_LINES = 70  # a function past this does several steps: name them


def test_modules_and_functions_stay_small():
    too_big = []
    for module, (path, _) in MODULES.items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_big.append(f"{module}: {len(text.splitlines())} lines")
        for n in ast.walk(ast.parse(text)):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES:
                too_big.append(f"{module}.{n.name}: {n.end_lineno - n.lineno + 1} lines")
    assert too_big == [], too_big
