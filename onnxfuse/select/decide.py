"""The one decision policy of measured selection: `decide(units, evidence, expects)`, a pure function (no
clocks, sessions or files) that gives each unit a `Decision`, kept or not and a `Reason`; `why` puts a decision
in words for the report. Nothing else decides, and no decision reads a message.

A unit's own measurement decides it where it is **firm**: its interval clears 1 by the margin (SIGNIFICANT plus
its noise floor) and either lies CLEAR margins from 1, or changes a MATERIAL share of the model and so does its
rewrite's measured classes together. Anything else (not timed, not settled by its runs, within the noise floor,
immaterial, unable to run alone) follows its **prior**, the first of:
  1. its rewrite's other units measured firm, or far from the line (peers), kept if most of them by weight were
     faster;
  2. the rules' `expect:` (kept where each expects faster, left out where one expects neutral);
  3. the op-cost prior (fewer kernel calls, no more bytes or FLOPs, into standard ops: kept);
  4. else the original.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from ..measure.stats import SIGNIFICANT, Ratio
from ..words import count
from .units import Kind, Unit

__all__ = ["CLEAR", "MATERIAL", "Basis", "Decision", "Evidence", "Origin", "Reason", "best_alone", "decide", "fall_back",
           "firm_faster",
           "why"]

# A measured effect that changes the model's time by less than this share is too small for any comparison of the
# model to see (the confirmation counts a change from SIGNIFICANT plus the floor), and its verdict, clear at the
# scale of its region, goes either way from run to run: a Slice for one Gather + Unsqueeze in GPT-2's shape
# arithmetic measured 1.003-1.012 of its 20 us region (0.003% of the model), kept on one run and not the next.
MATERIAL = 0.005
# ... unless the effect is far from the line: an interval that clears 1 by this many margins is no coin flip,
# whatever its share (cnn_small's Conv + HardSigmoid + Mul measured 0.838-0.848 alone, 0.47-0.50% of the model:
# kept quiet, and left out loaded as immaterial with nothing to follow)
CLEAR = 3.0


class Origin(Enum):
    HERE = "timed"  # measured in this run
    CACHE = "cached"  # measured by an earlier run on this machine (decision_cache.py)


@dataclass(frozen=True)
class Evidence:
    """What timing a unit showed: its effect (with / without), the noise floor, and the share of the model's
    time it changes (|1 - effect| x its regions' time / the model's; None unknown). `settled`: False where the
    budget ended its runs with the interval across the faster line (timed again by the next run)."""

    effect: Ratio
    floor: float
    share: float | None = None
    origin: Origin = Origin.HERE
    settled: bool = True

    @property
    def margin(self) -> float:
        return SIGNIFICANT + self.floor

    @property
    def sign(self) -> int:
        """1 (faster) or -1 (slower) where the whole interval clears 1 by the margin, else 0."""
        return self.effect.sign(self.margin)

    @property
    def far(self) -> bool:
        """The interval clears 1 by CLEAR margins."""
        return self.effect.sign(CLEAR * self.margin) != 0

    @property
    def signed_share(self) -> float:
        """What it saves of the model (negative: costs); inf where its share is unknown."""
        s = float("inf") if self.share is None else self.share
        return s * self.sign if self.sign else 0.0


class Reason(Enum):
    EXACT = "exact"  # removes nodes or computes shapes only: kept untimed
    FASTER = "faster"  # measured faster, firm
    SLOWER = "slower"  # measured slower, firm
    PEERS = "peers"  # follows its rewrite's units measured firm
    EXPECTS_FASTER = "expects faster"  # the rules' expect: faster
    EXPECTS_OTHER = "expects other"  # a rule's expect: neutral (or slower)
    OP_COST = "op cost"  # the op-cost prior: removes work
    NOTHING = "nothing"  # nothing to follow: the original


class Basis(Enum):
    """Why a prior decided: what the unit's own measurement lacked."""

    NOT_TIMED = "not timed"  # the budget did not reach it
    ALONE = "cannot run alone"
    UNSETTLED = "undecided"  # its runs ended with the interval across the faster line
    NOISE = "within the noise floor"  # measured, not clear of 1 by the margin
    IMMATERIAL = "immaterial"  # clear, but by too small a share of the model (itself, or its rewrite's units)


@dataclass(frozen=True)
class Decision:
    kept: bool
    reason: Reason
    basis: Basis | None = None  # set where a prior decided
    peers: int = 0  # how many units it followed (Reason.PEERS)
    net: float = 0.0  # what its rewrite's measured units save of the model together (signed)
    undone: str = ""  # the whole selection with it measured so (slower, ...): left out by the fallback


def fall_back(units: list[Unit], decisions: dict[str, Decision], how: str, firm_only: bool = True,
              exact_too: bool = False) -> dict[str, Decision]:
    """The decisions once a whole selection measured `how` (not faster): only what is kept on its own firm
    measurement, or exact, stays (`firm_only`); or only the exact rewrites (not `firm_only`); or nothing
    (`exact_too`). The rest is left out, and says why."""
    def keep(d: Decision) -> bool:
        return not exact_too and (firm_faster(d) if firm_only else d.reason is Reason.EXACT)

    return {u.id: d if not d.kept or keep(d) else replace(d, kept=False, undone=how)
            for u in units for d in (decisions[u.id],)}


def decide(units: list[Unit], evidence: dict[str, Evidence], expects: dict[str, str]) -> dict[str, Decision]:
    """Each unit's decision from its evidence (by unit id; absent: not timed) and the rules' expectations
    (rule id -> faster | neutral | slower | unknown)."""
    net: dict[tuple[str, ...], float] = {}
    for u in units:
        if (e := evidence.get(u.id)) is not None and e.sign:
            net[u.rewrite] = net.get(u.rewrite, 0.0) + e.signed_share
    peers: dict[tuple[str, ...], list[tuple[bool, float]]] = {}
    for u in units:
        e = evidence.get(u.id)
        if e is not None and e.sign and (e.far or abs(net[u.rewrite]) >= MATERIAL):
            peers.setdefault(u.rewrite, []).append((e.sign > 0, u.weight))
    return {u.id: _one(u, evidence.get(u.id), net.get(u.rewrite, 0.0), peers.get(u.rewrite, []), expects)
            for u in units}


def _one(u: Unit, e: Evidence | None, net: float, peers: list[tuple[bool, float]],
         expects: dict[str, str]) -> Decision:
    if u.kind is Kind.EXACT:
        return Decision(True, Reason.EXACT)
    if e is not None and e.sign and (e.far or (e.share is None or e.share >= MATERIAL) and abs(net) >= MATERIAL):
        return Decision(e.sign > 0, Reason.FASTER if e.sign > 0 else Reason.SLOWER, net=net)
    basis = (Basis.ALONE if u.kind is Kind.UNTIMEABLE else Basis.NOT_TIMED if e is None
             else Basis.IMMATERIAL if e.sign else Basis.UNSETTLED if not e.settled else Basis.NOISE)
    if peers:
        keep = 2 * sum(w for faster, w in peers if faster) > sum(w for _, w in peers)
        return Decision(keep, Reason.PEERS, basis, len(peers), net)
    said = {expects.get(r, "unknown") for r in u.rules}
    if said == {"faster"}:
        return Decision(True, Reason.EXPECTS_FASTER, basis, net=net)
    if said != {"unknown"}:
        return Decision(False, Reason.EXPECTS_OTHER, basis, net=net)
    if u.removes_work:
        return Decision(True, Reason.OP_COST, basis, net=net)
    return Decision(False, Reason.NOTHING, basis, net=net)


def best_alone(units: list[Unit], decisions: dict[str, Decision], evidence: dict[str, Evidence], how: str
               ) -> tuple[str, dict[str, Decision]] | None:
    """Where a whole selection of firm decisions measured `how` (its parts did not compose: a pair of fusions
    can let onnxruntime's own session fusions make a slow kernel), the fallback by groups: the rewrite (rules)
    whose units measured faster save the most of the model, kept alone with the exact rewrites; None where there
    is no other choice. Returns its label and the decisions."""
    saved: dict[tuple[str, ...], float] = {}
    for u in units:
        d, e = decisions[u.id], evidence.get(u.id)
        if d.kept and d.reason is Reason.FASTER and e is not None:
            saved[u.rewrite] = saved.get(u.rewrite, 0.0) + (e.share if e.share is not None else 0.0)
    if len(saved) < 2:
        return None
    best = max(sorted(saved), key=lambda k: saved[k])
    out = {u.id: d if not d.kept or d.reason is Reason.EXACT or u.rewrite == best else replace(d, kept=False, undone=how)
           for u in units for d in (decisions[u.id],)}
    return ", ".join(best), out


def firm_faster(d: Decision) -> bool:
    """Kept on its own measurement (what a selection falls back to when the whole measures no faster)."""
    return d.reason in (Reason.FASTER, Reason.EXACT)


def why(u: Unit, e: Evidence | None, d: Decision, expects: dict[str, str]) -> str:
    """The decision in words (the report's `how`), made from the enums, the evidence and the unit."""
    undone = f"; dropped: the selection with it measured {d.undone} as a whole" if d.undone else ""
    if d.reason is Reason.EXACT:
        return u.untimeable.value if u.untimeable else "acts on shape values only"
    if d.basis is None:
        return undone[2:]  # measured either way: the report shows the interval
    held = e is not None and e.effect.low <= 1 <= e.effect.high
    lead = {Basis.NOT_TIMED: ("whole model: " if u.kind is Kind.ON_MODEL else "") + "not timed within the budget",
            Basis.UNSETTLED: "undecided", Basis.NOISE: "no significant change" if held else "within the noise floor",
            Basis.ALONE: f"cannot run alone: {u.untimeable.value if u.untimeable else ''}"
                         + (f" ({u.detail})" if u.detail else "")}.get(d.basis, "")
    if d.basis is Basis.IMMATERIAL and e is not None:
        mine = e.share is not None and e.share < MATERIAL
        word = "faster" if e.sign > 0 else "slower"
        lead = (f"{word} by {e.share:.3%} of the model (immaterial)" if mine else
                f"{word}, but its rewrite's units change {abs(d.net):.2%} of the model in all (immaterial)")
    rules = ", ".join(u.rules)
    said = sorted({expects.get(r, "unknown") for r in u.rules})
    prior = {Reason.PEERS: f"follows the {count(d.peers, 'unit')} of this rewrite measured "
                           f"{'faster' if d.kept else 'slower'}",
             Reason.EXPECTS_FASTER: f"kept: {rules} expect{'s' if len(u.rules) == 1 else ''} faster (expect:)",
             Reason.EXPECTS_OTHER: f"nothing decided to follow; {rules} expect {'/'.join(said)}",
             Reason.OP_COST: f"kept: {u.cost}", Reason.NOTHING: "nothing decided to follow"}[d.reason]
    return (f"{lead}; {prior}" if lead else prior) + undone
