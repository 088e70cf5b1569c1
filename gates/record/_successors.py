"""Claims that replace others: what a claim tests (`design_of`), the rule that a claim registered
after the withdrawal of one with the same design names it in its supersedes chain
(`successor_problem`, which `gates run`, `gates check` and `gates verify` apply), and the
supersession links between claims (`link_supersession`).
"""

from __future__ import annotations

from pathlib import Path

from gates.record._index import EVIDENCE, INDEX, IndexEntry, parse_index
from gates.record._view import EvidenceView, as_view, raw_view

CONDITION_LISTS = ("supported_if", "refuted_if")


def design_of(source: EvidenceView | dict | None) -> list | None:
    """What a claim tests, never its wording: [study, [arm names], [[condition list, kind], ...]],
    from a contract's YAML mapping or from evidence (its view, or plain JSON); None when it does not
    say. Two claims with one design test the same arms of the same study with the same kinds of
    conditions (their bars, margins and claim text may differ: an easier bar is the same design)."""
    if isinstance(source, dict) and isinstance(source.get("decision"), dict):
        return _contract_design(source)
    ev = as_view(source)
    if ev is None or ev.study is None or not ev.arm_configs or not ev.conditions:
        return None
    return _design(ev.study, ev.arm_configs, [(c.list_name, c.kind) for c in ev.conditions])


def _contract_design(source: dict) -> list | None:
    """`design_of` a contract's YAML mapping (its `decision` a mapping)."""
    study, arms = source.get("study"), source.get("arms")
    if not isinstance(study, str):
        return None
    conditions = [
        (name, c.get("kind"))
        for name in CONDITION_LISTS
        for c in source["decision"].get(name) or []
        if isinstance(c, dict)
    ]
    return (
        _design(study, arms, conditions) if isinstance(arms, dict) and arms and conditions else None
    )


def _design(study: str, arms: dict, conditions: list) -> list:
    return [study, sorted(map(str, arms)), sorted([str(a), str(b)] for a, b in conditions)]


def successor_problem(
    runs_root: Path,
    contract_id: str,
    design: list | None,
    supersedes: str | None,
    entries: list[IndexEntry] | None = None,
) -> str | None:
    """Why the claim `contract_id` (of `design`, declaring `supersedes`) may not stand: a claim withdrawn
    before it was first recorded (or, not recorded yet, before now) has the same design, and its
    supersedes chain (what it declares, then what each evidence declares) does not reach it. Withdraw,
    then register the same experiment again under a new id unlinked, and the withdrawal would read as
    a fresh start; naming what it replaces puts the earlier attempt on its record. None otherwise."""
    runs_root = Path(runs_root)
    if design is None:
        return None
    if entries is None:
        entries = parse_index(runs_root)[0]
    first: int | None = None  # the line of this claim's first attempt
    withdrawn: dict[str, tuple[int, list | None]] = {}
    for e in entries:
        cid = e.contract_id
        if cid is None:
            continue
        if cid == contract_id and e.is_attempt and first is None:
            first = e.line
        if e.kind == "withdrawn":
            withdrawn[cid] = (e.line, e.design)
        elif e.is_attempt:
            withdrawn.pop(cid, None)  # recorded anew since: standing again
    if not withdrawn:
        return None
    chain, at = set(), supersedes
    while isinstance(at, str) and at not in chain:
        chain.add(at)
        ev = raw_view(runs_root / at / EVIDENCE)
        at = ev.supersedes if ev is not None else None
    for cid, (line, said) in sorted(withdrawn.items()):
        if cid == contract_id or cid in chain or (first is not None and first < line):
            continue
        if said is None:
            said = design_of(raw_view(runs_root / cid / EVIDENCE))
        if said == design:
            return (
                f"it tests what withdrawn {cid} tested ({INDEX} line {line}: study {design[0]}, "
                f"arms {', '.join(design[1])}, the same kinds of conditions) without naming it: "
                f"declare `supersedes: {cid}` (the withdrawn attempt goes on its record)"
            )
    return None


def link_supersession(
    claims: list, declared: dict[str, str], evidence: dict[str, EvidenceView | None]
) -> None:
    """Set each claim's `supersedes` and `superseded_by` (claims: objects with `contract_id`). What a
    contract declares (`declared`: id -> the id it supersedes) comes first; evidence whose contract
    is gone still says what it superseded."""
    supersedes = dict(declared)
    for cid, ev in evidence.items():
        if ev is not None and ev.supersedes is not None:
            supersedes.setdefault(cid, ev.supersedes)
    for claim in claims:
        claim.supersedes = supersedes.get(claim.contract_id)
        claim.superseded_by = sorted(
            new for new, old in supersedes.items() if old == claim.contract_id
        )
