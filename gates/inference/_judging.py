"""A contract's claim judged: its decision and controls over its seeds, at a fixed number of seeds
(`gates.inference.decide`) or look by look (`gates.inference._sequential`), with what the verdict needs beyond the
runs: each condition's ceiling and the tuned arms whose search stopped at an edge of its range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gates.entities import RunRecord, TuningRecord, Verdict
from gates.inference._sequential import judge_sequential
from gates.inference._verdict import decide
from gates.study import Metric


def judge(
    contract,
    runs: list[RunRecord],
    metrics: Mapping[str, Metric] | None = None,
    *,
    ceilings: Mapping[str, dict] | None = None,
    edges: Mapping[str, str] | None = None,
    level: float | None = None,
) -> Verdict:
    """A contract's verdict on its runs: its decision with its controls over its seeds, and for a
    sequential contract look by look (gates.inference._sequential). `ceilings` (condition label -> a resolved
    ceiling) and `edges` (tuned arm -> why its search stopped at an edge) come from the contract's study
    and its tuning record (`judge_claim`); `level`: the alpha its claim family leaves it (default: the
    decision's; its controls keep the decision's alpha: they judge the setup, not the claim)."""
    if getattr(contract, "sequential", None) is not None:
        return judge_sequential(
            contract, runs, metrics, ceilings=ceilings, edges=edges, level=level
        )
    return decide(
        contract.decision,
        runs,
        metrics,
        alpha=level,
        control_alpha=contract.decision.alpha,
        controls=contract.controls,
        seeds=list(contract.seeds),
        ceilings=ceilings,
        edges=edges,
    )


def claim_inputs(loaded) -> dict:
    """What a verdict needs beyond the runs, from a loaded contract: each condition's ceiling (the contract's
    or its study's), the tuned arms whose search stopped at an edge (its tuning record, when it tunes) and
    the alpha its claim family leaves it (`loaded.family`, gates.record.family_of)."""
    edges = None
    record = getattr(loaded, "tuning_record", None)
    if record:
        edges = tuning_edges(loaded.contract, record)
    family = getattr(loaded, "family", None)
    level = family.level(loaded.contract.decision.alpha) if family is not None else None
    return {"ceilings": loaded.ceilings(), "edges": edges, "level": level}


def judge_claim(loaded, runs: list[RunRecord]) -> Verdict:
    """The verdict of a loaded contract on its runs, with its study's metrics, its ceilings, its tuning
    record (`loaded.tuning_record`) and its claim family (`loaded.family`: the alpha it is judged at, and
    what it says beside the verdict): what every caller (a run, verify, rederive) goes through."""
    result = judge(loaded.contract, runs, loaded.study.metrics, **claim_inputs(loaded))
    family = getattr(loaded, "family", None)
    if family is not None:
        _family_notes(result, family, loaded.contract)
    return result


def _family_notes(result: Verdict, family, contract) -> None:
    """The claim family's line first among the reasons (where the family is more than this version), and
    for an inconclusive verdict a last line on what more seeds would be: a new version on the family's next
    seeds at the alpha the family has left after this one, or, with none left, not this claim at all."""
    own = contract.decision.alpha
    level = family.level(own)
    if family.recorded(own):
        result.reasons = [family.describe(own)] + result.reasons
    if result.verdict != "inconclusive":
        return
    if level <= 0:
        result.reasons.append(
            f"its claim family ({family.root}) had no alpha left when it ran: the versions before it "
            f"spent {family.spent:g} of {family.alpha:g}, so no decision condition could hold or fail"
        )
        result.settle = [
            f"nothing within this claim: its family's alpha is spent ({family.spent:g} of "
            f"{family.alpha:g}); a new question is a new claim (a contract without `supersedes`), "
            f"shown beside this family's record, which stays"
        ] + [line for line in result.settle if line.startswith("controls[")]
        return
    after = family.then(contract)  # what a re-try would inherit
    if after.left <= 0:
        result.settle.append(
            f"more seeds cannot settle it as this claim: its family ({family.root}) spends its whole "
            f"alpha {family.alpha:g} here, so a new version could neither support nor refute; the seed "
            f"counts above are what a new claim (a contract without `supersedes`) would need"
        )
        return
    result.settle.append(
        f"more seeds are a new version: `supersedes: {contract.id}`, `seeds: {{count: N, start: "
        f"{after.next_seed}}}` (the family's next) and `decision.alpha` at most {after.left:g}, what its "
        f"family ({family.root}) has left after this version; the seed counts above are at alpha {level:g}"
    )


def tuning_edges(contract, record: dict) -> dict[str, str]:
    """tuned arm -> why its search may have stopped short of its best config: for a numeric parameter, the
    best trial's value is the lowest or the highest value any completed trial tried (the optimum may lie
    beyond it), on a side the contract does not declare a hard limit (`hard: [low]`), or only one value
    was tried. A decision condition reading such an arm is undetermined (gates.inference). `record`:
    the tuning record as evidence.json holds it, checked into a TuningRecord here."""
    space = contract.tuning.space if contract.tuning is not None else {}
    out = {}
    for arm, r in TuningRecord.model_validate(record).arms.items():
        best = r.best
        if not best:
            continue
        done = [
            t
            for t in r.trials
            if t.state == "completed" and t.value is not None and math.isfinite(t.value)
        ]
        notes = []
        for key, p in space.items():
            if p.type == "categorical" or key not in best.params:
                continue
            tried = sorted({float(t.params[key]) for t in done if key in t.params})
            value = float(best.params[key])
            if len(tried) < 2:
                notes.append(
                    f"{key}: only one value was tried ({value:.4g}), so nothing was searched"
                )
                continue
            for side, at_edge, where in (
                ("low", value <= tried[0], "below"),
                ("high", value >= tried[-1], "above"),
            ):
                if at_edge and side not in p.hard:
                    notes.append(
                        f"{key} = {value:.4g} is the {'lowest' if side == 'low' else 'highest'} of the "
                        f"{len(tried)} values tried; widen the search {where} {value:.4g}"
                    )
        if notes:
            out[arm] = "; ".join(notes)
    return out


# ---------------------------------------------------------------------------------- verify
