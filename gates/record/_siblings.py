"""Claims that stand together: contracts sharing a regime, and runs shared across contracts.

* A study declares the arm config fields that set the data and training regime several contracts
  share (`Study.regime_fields`: relation_closure's teacher and teacher_layer). Each evidence records
  its contract's regime (`regime`). When a contract is superseded by one in another regime, that
  regime was left for a reason about it: every other claim still standing in it (not superseded, not
  withdrawn) is flagged in `gates status`, `gates verify` and the dashboard until it is superseded or
  withdrawn too.
* Two contracts that run the same study, arm config, seed and budget run the same experiment: their
  runs are one observation, not independent replications. Each verdict names the runs it shares.

Everything here reads evidence leniently (`EvidenceView`; no study is imported), so `gates status` can show it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gates.contract import canonical_json
from gates.record._view import EvidenceView, as_view


def regime_of(loaded) -> dict | None:
    """The contract's regime: {field: value} over the study's regime fields (a field whose value differs
    between arms lists the distinct values); None for a study that declares none."""
    fields = tuple(getattr(loaded.study, "regime_fields", ()) or ())
    if not fields:
        return None
    regime = {}
    for name in fields:
        values = list(
            dict.fromkeys(
                canonical_json(cfg.model_dump(mode="json").get(name))
                for cfg in loaded.arm_configs.values()
            )
        )
        regime[name] = (
            json.loads(values[0]) if len(values) == 1 else [json.loads(v) for v in values]
        )
    return regime


def _regime_key(ev: EvidenceView) -> str | None:
    return canonical_json([ev.study, ev.regime]) if ev.regime is not None else None


def _views(evidence: dict[str, EvidenceView | dict | None]) -> dict[str, EvidenceView]:
    """id -> its evidence viewed (plain JSON too), the unreadable left out."""
    views = {cid: as_view(ev) for cid, ev in evidence.items()}
    return {cid: ev for cid, ev in views.items() if ev is not None}


def describe_regime(regime: dict) -> str:
    return ", ".join(f"{k}={canonical_json(v)[:60]}" for k, v in regime.items())


@dataclass(frozen=True)
class RegimeLeft:
    """A claim still standing in a regime its sibling left: which sibling, superseded by which contract,
    and the regime fields that changed."""

    sibling: str
    superseded_by: str
    changes: tuple[str, ...]

    @property
    def note(self) -> str:
        return (
            f"its regime was left when its sibling {self.sibling} was superseded by {self.superseded_by} "
            f"({', '.join(self.changes)}); supersede or withdraw this claim too, unless the change does not "
            f"concern it"
        )

    def as_dict(self) -> dict:
        return {
            "sibling": self.sibling,
            "superseded_by": self.superseded_by,
            "changes": list(self.changes),
            "note": self.note,
        }


def regimes_left(
    claims: list, evidence: dict[str, EvidenceView | dict | None]
) -> dict[str, RegimeLeft]:
    """contract id -> the regime left, for each claim still standing in a regime that a superseded sibling
    left (claims: objects with contract_id, superseded_by, withdrawn; evidence: id -> its view, its JSON
    or None)."""
    evidence = _views(evidence)
    keys = {cid: _regime_key(ev) for cid, ev in evidence.items()}
    left: dict[str, tuple[str, str]] = {}  # regime key -> (superseded id, superseding id)
    for claim in claims:
        old = keys.get(claim.contract_id)
        for new in claim.superseded_by:
            if old is not None and keys.get(new) is not None and keys[new] != old:
                left.setdefault(old, (claim.contract_id, new))
    found = {}
    for claim in claims:
        key = keys.get(claim.contract_id)
        if key is None or key not in left or claim.superseded_by or claim.withdrawn:
            continue
        old, new = left[key]
        if old == claim.contract_id:
            continue
        changes = _changes(evidence[claim.contract_id].regime or {}, evidence[new].regime or {})
        found[claim.contract_id] = RegimeLeft(old, new, tuple(changes))
    return found


def _changes(before: dict, after: dict, prefix: str = "") -> list[str]:
    """'field old -> new' for each field that differs (nested settings by their dotted path)."""
    out = []
    for key in dict.fromkeys(list(before) + list(after)):
        a, b = before.get(key), after.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changes(a, b, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key} {canonical_json(a)[:40]} -> {canonical_json(b)[:40]}")
    return out


def run_keys(ev: EvidenceView) -> dict[str, str]:
    """arm/seed -> what makes the run the experiment it is: study, the arm config that ran (but `device`,
    where it ran, which older evidence did not record), seed, budget."""

    def config(arm: str) -> dict:
        return {k: v for k, v in ev.arm_configs[arm].items() if k != "device"}

    return {
        f"{r.arm}/seed {r.seed}": canonical_json([ev.study, config(r.arm), r.seed, ev.budget])
        for r in ev.runs
        if r.arm in ev.arm_configs and r.seed is not None
    }


def shared_runs(
    evidence: dict[str, EvidenceView | dict | None], only: str | None = None
) -> dict[str, dict[str, list[str]]]:
    """contract id -> {other contract id: [arm/seed of this contract's runs that the other ran too]}
    (evidence: id -> its view, its JSON or None)."""
    by_key: dict[str, list[tuple[str, str]]] = {}
    keys = {cid: run_keys(ev) for cid, ev in _views(evidence).items()}
    for cid, runs in keys.items():
        for run, key in runs.items():
            by_key.setdefault(key, []).append((cid, run))
    out: dict[str, dict[str, list[str]]] = {}
    for cid, runs in keys.items():
        if only is not None and cid != only:
            continue
        for run, key in runs.items():
            for other, _ in by_key[key]:
                if other != cid:
                    out.setdefault(cid, {}).setdefault(other, []).append(run)
    return out


def describe_shared(shared: dict[str, list[str]]) -> str:
    """'shares 10 runs with X (lifting/seed 0, ...): ...', one line."""
    parts = [
        f"{len(runs)} with {other} ({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''})"
        for other, runs in sorted(shared.items())
    ]
    return (
        f"shares runs with other contracts (same study, arm config, seed and budget): {'; '.join(parts)}; "
        f"each shared run is one observation, not an independent replication"
    )


def annotate_siblings(claims: list, evidence: dict[str, EvidenceView | dict | None]) -> None:
    """Set each claim's `shared_runs` and `regime_left` (claims: gates.verify's ClaimCheck, or what `gates
    status` lists; their `superseded_by` and `withdrawn` already set)."""
    evidence = _views(evidence)
    shared, left = shared_runs(evidence), regimes_left(claims, evidence)
    for claim in claims:
        claim.shared_runs = shared.get(claim.contract_id, {})
        claim.regime_left = left.get(claim.contract_id)
