"""A claim's conditions and controls as a reviewer reads them: what each compares (arm, metric, bar),
the arm's value apart from the margin beyond the bar, what its result means for the claim, and a
supported_if condition merged with its refuted_if mirror into one row. One reading for every page
that shows them: verdict.md, `gates run`'s verdict and the dashboard.

Everything is read from the evidence (`ConditionRecord`), so the page says the same with or without
the contract file: a condition's description is the verdict engine's own wording of it
(gates.inference `_describe`: `arm.metric >= 0.95`, `a.m >= b.m + 0.5`, `a.m <= b.m * (1 - 0.3)`,
`trend lower: a.m > b.m > c.m`), and its terms are the keys of its per-seed values.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gates.entities import ConditionRecord

SUPPORTS, REFUTES, UNDETERMINED = "supports", "refutes", "undetermined"
SOUND, INVALIDATES = "sound", "invalidates"  # a control: the setup can be trusted, or it cannot

_FLIP = {">=": "<=", "<=": ">="}
_COMPARE = re.compile(
    r"^(?P<b>\S+)(?: (?P<sign>[+-]) (?P<margin>\S+)| \* \(1 (?P<rsign>[+-]) (?P<relative>\S+)\))?$"
)


@dataclass(frozen=True)
class ConditionBar:
    """What a condition compares: its terms as (arm, metric), its operator and its bar.

    `mirror` is what a mirror condition has in common with it (the same terms and the same
    boundary, the terms in one order) and `mirror_op` its operator with the terms in that order: a
    mirror has the other operator. None: no mirror (a trend, or a description of another shape)."""

    terms: tuple[tuple[str, str], ...]
    op: str | None  # ">=" or "<=" (None: a trend)
    bar: str  # the right-hand side as written: "0.95", "flat_address.test_acc + 0.5"
    mirror: tuple | None = None
    mirror_op: str | None = None

    @property
    def threshold(self) -> float | None:
        """A threshold condition's bar as a number (None for other kinds)."""
        return self.mirror[2] if self.mirror and self.mirror[0] == "threshold" else None


def split_term(term: str, arms: list[str]) -> tuple[str, str]:
    """'arm.metric' as (arm, metric), by the longest arm name it starts with (an arm name may hold a
    dot); else at its first dot."""
    for arm in sorted(arms, key=len, reverse=True):
        if term.startswith(arm + "."):
            return arm, term[len(arm) + 1 :]
    arm, _, metric = term.partition(".")
    return arm, metric


def bar_of(record: ConditionRecord, arms: list[str]) -> ConditionBar:
    """The condition's terms, operator and bar, read from its description and its values' keys."""
    desc, keys = record.description, list(record.values)
    head, op, rest = _split_op(desc)
    if record.kind == "trend" or op is None:
        return ConditionBar(tuple(split_term(k, arms) for k in keys), None, desc)
    a = split_term(head, arms)
    try:
        return ConditionBar((a,), op, rest, ("threshold", head, float(rest)), op)
    except ValueError:
        pass
    m = _COMPARE.match(rest)
    if m is None:
        return ConditionBar(tuple(split_term(k, arms) for k in keys), op, rest)
    b = m["b"]
    terms = (a, split_term(b, arms))
    if m["relative"] is not None:
        return ConditionBar(terms, op, rest, ("relative", head, b, m["rsign"], m["relative"]), op)
    try:
        offset = float(m["margin"]) * (-1 if m["sign"] == "-" else 1) if m["margin"] else 0.0
    except ValueError:  # not the engine's wording: shown as written, never merged
        return ConditionBar(terms, op, rest)
    if head <= b:
        return ConditionBar(terms, op, rest, ("compare", head, b, offset), op)
    # b op' a - offset, with the other operator: the same boundary read from the other side
    return ConditionBar(terms, op, rest, ("compare", b, head, -offset), _FLIP[op])


def _split_op(desc: str) -> tuple[str, str | None, str]:
    for op in (">=", "<="):
        head, found, rest = desc.partition(f" {op} ")
        if found:
            return head, op, rest
    return desc, None, ""


def meaning(record: ConditionRecord) -> str:
    """What the result means for the claim: a supported_if condition that holds supports it, one that
    fails refutes it; a refuted_if condition that holds refutes it, one that fails rules that
    refutation out (on the claim's side); a control that holds is sound, else it invalidates the
    verdict (fails, or cannot be settled)."""
    if record.list_name == "controls":
        return SOUND if record.outcome == "holds" else INVALIDATES
    if record.outcome == "undetermined":
        return UNDETERMINED
    holds = record.outcome == "holds"
    return SUPPORTS if holds == (record.list_name == "supported_if") else REFUTES


def holding_side(record: ConditionRecord) -> str:
    """What landing on the side of the bar where this condition holds means for the claim."""
    if record.list_name == "controls":
        return SOUND
    return SUPPORTS if record.list_name == "supported_if" else REFUTES


OTHER_SIDE = {SUPPORTS: REFUTES, REFUTES: SUPPORTS, SOUND: INVALIDATES, INVALIDATES: SOUND}


def condition_sentence(record: ConditionRecord) -> str:
    """The result in words, with what it means."""
    if record.list_name == "controls":
        return {
            "holds": "holds: the setup can show the effect",
            "fails": "fails: invalidates the verdict",
        }.get(record.outcome, "cannot be settled: invalidates the verdict")
    if record.outcome == "undetermined":
        return "undetermined"
    if record.list_name == "supported_if":
        return "holds: supports the claim" if record.outcome == "holds" else "fails: refutes it"
    return "holds: refutes the claim" if record.outcome == "holds" else "fails: rules it out"


@dataclass(frozen=True)
class ConditionRow:
    """One row of a conditions table: a condition, or a supported_if condition and its refuted_if
    mirror (the same terms and bar, the other way round), which the engine judges on the same values."""

    records: tuple[ConditionRecord, ...]
    bar: ConditionBar

    @property
    def first(self) -> ConditionRecord:
        return self.records[0]

    @property
    def merged(self) -> bool:
        return len(self.records) == 2

    @property
    def meaning(self) -> str:
        """The row's meaning for the claim: refutes when either side refutes, else the supported_if
        side's (a refuted_if mirror that fails does not make an unsettled support settled)."""
        found = [meaning(r) for r in self.records]
        if REFUTES in found:
            return REFUTES
        return found[0]

    @property
    def landed(self) -> str:
        """Which side of the bar a merged row landed on, in words."""
        s, r = self.records
        if self.meaning == REFUTES:
            which = r if r.outcome == "holds" else s
            return f"refuted side: {condition_label(which)} {which.outcome}"
        if self.meaning == SUPPORTS:
            return f"supported side: {condition_label(s)} holds, {condition_label(r)} {r.outcome}"
        if r.outcome == "fails":
            return f"neither side: {condition_label(r)} fails (not refuted), {condition_label(s)} undetermined"
        return "neither side: both undetermined"


def condition_label(record: ConditionRecord) -> str:
    return record.label


def condition_rows(records: list[ConditionRecord], arms: list[str]) -> list[ConditionRow]:
    """The conditions in order, each supported_if condition merged with the first refuted_if
    condition that mirrors it (it takes the supported_if condition's place)."""
    bars = [bar_of(r, arms) for r in records]
    taken: set[int] = set()
    out = []
    for i, (record, bar) in enumerate(zip(records, bars)):
        if i in taken:
            continue
        mate = None
        if record.list_name == "supported_if" and bar.mirror is not None:
            mate = next(
                (
                    j
                    for j, (other, b) in enumerate(zip(records, bars))
                    if j not in taken
                    and other.list_name == "refuted_if"
                    and b.mirror == bar.mirror
                    and b.mirror_op == _FLIP[bar.mirror_op]
                ),
                None,
            )
        if mate is None:
            out.append(ConditionRow((record,), bar))
        else:
            taken.add(mate)
            out.append(ConditionRow((record, records[mate]), bar))
    return out


@dataclass(frozen=True)
class TermValue:
    term: str  # arm.metric
    centre: float | None  # mean across seeds (geometric mean on a log scale)
    seeds: int  # finite values it is over


def term_values(record: ConditionRecord) -> list[TermValue]:
    """Each term's value across seeds: the mean, or on a log scale the geometric mean (what the
    condition compares); None without a finite value."""
    log = record.scale == "log"
    out = []
    for term, values in record.values.items():
        xs = [x for x in values if x is not None and math.isfinite(x)]
        if log and xs and all(x > 0 for x in xs):
            centre = math.exp(sum(math.log(x) for x in xs) / len(xs))
        else:
            centre = sum(xs) / len(xs) if xs else None
        out.append(TermValue(term, centre, len(xs)))
    return out


def condition_difference(record: ConditionRecord) -> tuple[str, str, str, float] | None:
    """A two-term comparison's raw difference of its terms' values before any margin, a ratio on a
    log scale: (term a, "-" or "/", term b, value). None for other conditions or missing values."""
    values = term_values(record)
    if record.kind != "compare" or len(values) != 2 or None in (v.centre for v in values):
        return None
    a, b = values
    if record.scale == "log":
        return (a.term, "/", b.term, a.centre / b.centre) if b.centre else None
    return a.term, "-", b.term, a.centre - b.centre


def term_short_names(record: ConditionRecord, bar: ConditionBar) -> dict[str, str]:
    """term -> how a table names it: the arm where every term reads the same metric, the metric
    where they all read one arm, else the whole term."""
    terms = list(record.values)
    if len(terms) != len(bar.terms) or len(terms) < 2:
        return {t: t for t in terms}
    arms, metrics = [a for a, _ in bar.terms], [m for _, m in bar.terms]
    if len(set(metrics)) == 1 and len(set(arms)) == len(arms):
        return dict(zip(terms, arms))
    if len(set(arms)) == 1 and len(set(metrics)) == len(metrics):
        return dict(zip(terms, metrics))
    return {t: t for t in terms}
