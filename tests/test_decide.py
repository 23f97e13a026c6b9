"""The one decision policy (select/decide.py), tested on tables: units, their evidence and the rules' expectations
in; decisions and reasons out. No clocks, sessions or files."""

import ast
import pathlib
import re

import pytest

from onnxfuse.measure.stats import Ratio
from onnxfuse.select.decide import (
    MATERIAL,
    Basis,
    Evidence,
    Reason,
    best_alone,
    decide,
    fall_back,
    why,
)
from onnxfuse.select.units import Kind, Unit, Untimeable

FASTER, SLOWER = Ratio(0.9, 0.88, 0.92), Ratio(1.1, 1.08, 1.12)  # clear of 1 by more than 3 margins
FLAT = Ratio(1.005, 0.99, 1.02)  # holds 1
A_BIT_FASTER = Ratio(0.975, 0.965, 0.985)  # clear by one margin, not three
A_BIT_SLOWER = Ratio(1.02, 1.016, 1.024)
ROOT = pathlib.Path(__file__).resolve().parent.parent


def unit(uid, rules, kind=Kind.CLASS, weight=1.0, removes_work=False, untimeable=None):
    return Unit(uid, "op", tuple(rules), kind, frozenset({(rules[0], uid)}), 1, weight, removes_work,
                "op cost: 1 kernel call fewer, 32 B fewer moved" if removes_work else "", untimeable)


def ev(effect, share=0.05, floor=0.005, settled=True):
    return Evidence(effect, floor, share, settled=settled)


# (units, evidence, expects, expected {id: (kept, reason, basis)})
TABLE = {
    "measured faster or slower, material: the measurement decides": (
        [unit("a", ["conv-relu"]), unit("b", ["gelu"])], {"a": ev(FASTER), "b": ev(SLOWER)}, {},
        {"a": (True, Reason.FASTER, None), "b": (False, Reason.SLOWER, None)}),
    "not timed: follows its rewrite's units measured firm, by weight": (
        [unit("a", ["conv-relu"], weight=3), unit("b", ["conv-relu"]), unit("c", ["conv-relu"])],
        {"a": ev(FASTER), "b": ev(SLOWER)}, {},
        {"a": (True, Reason.FASTER, None), "b": (False, Reason.SLOWER, None),
         "c": (True, Reason.PEERS, Basis.NOT_TIMED)}),
    "no peer: the rule's expect: faster keeps it, neutral leaves it out, unknown: the original": (
        [unit("a", ["erf-gelu"]), unit("b", ["relu-same"]), unit("c", ["conv-relu"])], {"a": ev(FLAT)},
        {"erf-gelu": "faster", "relu-same": "neutral"},
        {"a": (True, Reason.EXPECTS_FASTER, Basis.NOISE), "b": (False, Reason.EXPECTS_OTHER, Basis.NOT_TIMED),
         "c": (False, Reason.NOTHING, Basis.NOT_TIMED)}),
    "the op-cost prior keeps work removed into standard ops where the rules say nothing": (
        [unit("a", ["gather-unsqueeze-slice"], removes_work=True),
         unit("b", ["skip-layernorm"], removes_work=True)], {"a": ev(FLAT), "b": ev(FLAT)},
        {"skip-layernorm": "neutral"},
        {"a": (True, Reason.OP_COST, Basis.NOISE), "b": (False, Reason.EXPECTS_OTHER, Basis.NOISE)}),
    "immaterial (0.003% of the model) slower: follows its rewrite's material faster units": (
        [unit("a", ["slice"], weight=3), unit("b", ["slice"])],
        {"a": ev(A_BIT_FASTER, 0.02), "b": ev(A_BIT_SLOWER, 0.00003)},
        {}, {"a": (True, Reason.FASTER, None), "b": (True, Reason.PEERS, Basis.IMMATERIAL)}),
    "a rewrite immaterial to the model (0.25% in all): no unit of it decides, its prior does": (
        [unit("a", ["conv-relu"]), unit("b", ["conv-relu"])], {"a": ev(A_BIT_FASTER, 0.0025)}, {},
        {"a": (False, Reason.NOTHING, Basis.IMMATERIAL), "b": (False, Reason.NOTHING, Basis.NOT_TIMED)}),
    "far from the line (3 margins): decides itself whatever its share, and leads its peers": (
        [unit("a", ["conv-hardswish"]), unit("b", ["conv-hardswish"]), unit("c", ["rmsnorm-zero-skip"])],
        {"a": ev(Ratio(0.838, 0.814, 0.844), 0.0047), "c": ev(Ratio(1.26, 1.257, 1.263), 0.004)},
        {"rmsnorm-zero-skip": "faster"},
        {"a": (True, Reason.FASTER, None), "b": (True, Reason.PEERS, Basis.NOT_TIMED),
         "c": (False, Reason.SLOWER, None)}),
    "undecided (its runs ended across the line): a prior, said so": (
        [unit("a", ["erf-gelu"])], {"a": ev(Ratio(0.99, 0.98, 1.0), settled=False)}, {"erf-gelu": "faster"},
        {"a": (True, Reason.EXPECTS_FASTER, Basis.UNSETTLED)}),
    "exact and untimeable units": (
        [unit("a", ["add-zero"], Kind.EXACT, untimeable=Untimeable.REMOVES_ONLY),
         unit("b", ["conv-relu"], Kind.UNTIMEABLE, untimeable=Untimeable.HOLDS_SUBGRAPH), unit("c", ["conv-relu"])],
        {"c": ev(FASTER)}, {},
        {"a": (True, Reason.EXACT, None), "b": (True, Reason.PEERS, Basis.ALONE), "c": (True, Reason.FASTER, None)}),
    "an on-model group follows the same chain (its rules' units timed alone)": (
        [unit("a", ["se-gate-broadcast"], Kind.ON_MODEL), unit("b", ["se-gate-broadcast"])],
        {"a": ev(FLAT, 0.005), "b": ev(SLOWER)}, {},
        {"a": (False, Reason.PEERS, Basis.NOISE), "b": (False, Reason.SLOWER, None)}),
}


@pytest.mark.parametrize("case", list(TABLE))
def test_decide_on_a_table(case):
    units, evidence, expects, expected = TABLE[case]
    got = decide(units, evidence, expects)
    assert {k: (d.kept, d.reason, d.basis) for k, d in got.items()} == expected


def test_a_decision_does_not_depend_on_the_order_of_units_or_on_deciding_again():
    units, evidence, expects, _ = TABLE["immaterial (0.003% of the model) slower: follows its rewrite's material faster units"]
    once = decide(units, evidence, expects)
    assert decide(units[::-1], evidence, expects) == once == decide(units, evidence, expects)


def test_the_same_measurement_of_a_slower_class_is_decided_the_same_with_more_peers():
    """One first-pass class slower but immaterial alone is kept by its rule's expect:; decided again with four
    more of its rewrite (material together), it follows them, as if decided once with all of them."""
    slower = [unit(f"s{i}", ["rmsnorm-zero-skip"]) for i in range(5)]
    evidence = {u.id: ev(A_BIT_SLOWER, 0.004) for u in slower}
    expects = {"rmsnorm-zero-skip": "faster"}
    assert decide(slower[:1], evidence, expects)["s0"].reason is Reason.EXPECTS_FASTER
    all5 = decide(slower, evidence, expects)
    # 2% of the model together: material; each under MATERIAL alone, so each follows the five
    assert not all5["s0"].kept and all5["s0"].reason is Reason.PEERS and all5["s0"].basis is Basis.IMMATERIAL
    assert abs(all5["s0"].net) == pytest.approx(5 * 0.004) and 5 * 0.004 >= MATERIAL
    assert why(slower[0], evidence["s0"], all5["s0"], expects) == \
        "slower by 0.400% of the model (immaterial); follows the 5 units of this rewrite measured slower"


def test_why_is_made_from_the_enums():
    units, evidence, expects, _ = TABLE["immaterial (0.003% of the model) slower: follows its rewrite's material faster units"]
    d = decide(units, evidence, expects)
    assert why(units[1], evidence["b"], d["b"], expects) == \
        "slower by 0.003% of the model (immaterial); follows the 2 units of this rewrite measured faster"
    assert why(units[0], evidence["a"], d["a"], expects) == ""
    u = unit("x", ["conv-relu"], Kind.UNTIMEABLE, untimeable=Untimeable.HOLDS_SUBGRAPH)
    assert why(u, None, decide([u], {}, {})["x"], {}) == "cannot run alone: holds a subgraph; nothing decided to follow"
    g = unit("g", ["gelu"])
    assert why(g, None, decide([g], {}, {"gelu": "faster"})["g"], {"gelu": "faster"}) == \
        "not timed within the budget; kept: gelu expects faster (expect:)"


def test_the_fallback_keeps_what_was_measured_faster_then_the_group_that_saved_the_most():
    units = [unit("a", ["attention"]), unit("b", ["bias-gelu"]), unit("c", ["erf-gelu"]),
             unit("x", ["add-zero"], Kind.EXACT)]
    evidence = {"a": ev(FASTER, 0.08), "b": ev(FASTER, 0.01)}
    d = decide(units, evidence, {"erf-gelu": "faster"})
    firm = fall_back(units, d, "slower")
    assert {k for k, v in firm.items() if v.kept} == {"a", "b", "x"} and firm["c"].undone == "slower"
    label, best = best_alone(units, firm, evidence, "slower")
    assert label == "attention" and {k for k, v in best.items() if v.kept} == {"a", "x"}
    assert why(units[1], evidence["b"], best["b"], {}) == "dropped: the selection with it measured slower as a whole"
    none = fall_back(units, d, "slower", firm_only=False)
    assert {k for k, v in none.items() if v.kept} == {"x"}
    assert not any(v.kept for v in fall_back(units, d, "slower", firm_only=False, exact_too=True).values())


def test_decide_is_pure():
    """decide.py reads no clock, session, file or environment."""
    tree = ast.parse((ROOT / "onnxfuse/select/decide.py").read_text())
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not imported & {"time", "os", "onnxruntime", "random", "numpy"}
    assert not any(isinstance(n, ast.Name) and n.id == "open" for n in ast.walk(tree))


# how code would read a message to decide: comparing, searching or testing membership of a sentence
MESSAGE_READS = re.compile(r"\.(why|note|status|untimeable|detail|word|outcome|verdict)\s*(==|!=|\.startswith|"
                           r"\.endswith|\s+in\b)|verdict_beyond\([^)]*\)\s*(==|!=|in\b)|\b(in|not in)\s+NOT_ALONE"
                           r"|str\(e\)\s*(==|in)|\"(faster|slower)\"\s+in\b")


def test_no_decision_reads_a_message():
    """Rewording a message cannot change what is kept: select/ and measure/ compare enums, never sentences."""
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
            for folder in ("onnxfuse/select", "onnxfuse/measure") for p in sorted((ROOT / folder).glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if MESSAGE_READS.search(line)]
    assert hits == []


def _worked_example() -> list[list[str]]:
    text = (ROOT / "docs/measured-selection.md").read_text()
    table = text.split("<!-- worked-example -->")[1].split("<!-- /worked-example -->")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.strip().splitlines()[2:]]
    assert rows, "no worked example in docs/measured-selection.md"
    return rows


def _pct(text: str) -> float:
    return float(text.rstrip("%")) / 100


def test_the_docs_worked_example_is_what_decide_decides():
    """docs/measured-selection.md's worked example: its units and evidence, with the built-in rules'
    expectations, give the decisions, reasons and words it shows."""
    import onnxfuse

    expects = {r.id: r.expect for r in onnxfuse.load_rules()}
    kinds = {"class": Kind.CLASS, "exact": Kind.EXACT, "on model": Kind.ON_MODEL}
    units, evidence, shown = [], {}, {}
    for i, (label, rules, kind, regions, effect, floor, share, kept, reason, words) in enumerate(_worked_example()):
        u = Unit(str(i), label, tuple(rules.split(", ")), kinds[kind], frozenset({(rules, str(i))}), int(regions),
                 float(regions), untimeable=Untimeable.REMOVES_ONLY if kind == "exact" else None)
        units.append(u)
        if effect != "—":
            m = re.match(r"([\d.]+) \[([\d.]+), ([\d.]+)\]( undecided)?", effect)
            evidence[u.id] = Evidence(Ratio(*map(float, m.groups()[:3])), _pct(floor), _pct(share),
                                      settled=not m.group(4))
        shown[u.id] = (kept == "yes", Reason(reason), words)
    got = decide(units, evidence, expects)
    for u in units:
        kept, reason, words = shown[u.id]
        assert (got[u.id].kept, got[u.id].reason) == (kept, reason), (u.label, got[u.id])
        if not words.startswith("("):
            assert why(u, evidence.get(u.id), got[u.id], expects) == words, u.label
