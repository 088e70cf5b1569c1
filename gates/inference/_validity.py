"""What keeps a verdict from standing on its runs: values lost (a seed without a finite value of what
a condition reads), arms not run as designed (no completed run: invalid), arms still improving or tuned
to an edge of their search (undetermined), bars beyond what the best possible arm reaches (invalid),
and a line per run that did not complete.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from gates.contract import CeilingRef, Trend, condition_terms
from gates.entities import (
    BeyondCeilingRecord,
    ConditionRecord,
    LostValueRecord,
    NotRunRecord,
    RunRecord,
)
from gates.inference._effects import _effects
from gates.inference._results import _join


def _withhold(
    results: list[ConditionRecord], listed, runs: list[RunRecord], edges: Mapping[str, str]
) -> tuple[list[ConditionRecord], dict[str, dict]]:
    """Leave undetermined every decision condition that reads an arm still improving at the end of its runs
    (`convergence`) or tuned by a search that stopped at an edge: the results so revised, and condition
    label -> {"still": arm -> seeds still improving, "edges": [arm: why]} (for the settle line)."""
    unconverged = _unconverged(runs)
    stalled: dict[str, dict] = {}
    revised = []
    for r, (_, _, c) in zip(results, listed):
        arms = list(dict.fromkeys(a for a, _ in condition_terms(c)))
        still = {a: unconverged[a] for a in arms if a in unconverged}
        at_edge = [f"{a}: {edges[a]}" for a in arms if a in edges]
        if still or at_edge:
            stalled[r.label] = {"still": still, "edges": at_edge}
        note = r.note
        if still:
            note = _join(
                note,
                "still improving at the end of training: "
                + "; ".join(
                    f"{a} seed{'s' if len(v) > 1 else ''} {', '.join(map(str, v))}"
                    for a, v in still.items()
                )
                + "; needs more steps",
            )
        if at_edge:
            note = _join(note, "tuning stopped at the edge of its search: " + "; ".join(at_edge))
        revised.append(r.revised(outcome="undetermined", note=note) if still or at_edge else r)
    return revised, stalled


def _unconverged(runs: list[RunRecord]) -> dict[str, list[int]]:
    """arm -> seeds of completed runs recorded as still improving at their end."""
    still: dict[str, list[int]] = {}
    for r in runs:
        if r.status == "completed" and r.converged is False:
            still.setdefault(r.arm, []).append(r.seed)
    return still


def _expected(runs: list[RunRecord], seeds: list[int] | None) -> list[int]:
    return sorted(set(seeds) if seeds is not None else {r.seed for r in runs})


def _lost_values(
    read: list[tuple[str, str]], runs: list[RunRecord], samples, seeds: list[int] | None
) -> list[LostValueRecord]:
    """Every (arm, metric, seed) among `read` that the runs do not give a finite value for, over the
    expected seeds (default: those any run was recorded with)."""
    by_key = {(r.arm, r.seed): r for r in runs}
    lost = []
    for arm, metric in dict.fromkeys(read):
        for seed in _expected(runs, seeds):
            if seed in samples.get((arm, metric), {}):
                continue
            run = by_key.get((arm, seed))
            if run is None:
                why = "no run recorded"
            elif run.status != "completed":
                why = run.status + (f": {run.halt_reason}" if run.halt_reason else "")
            else:
                why = "no finite value"
            lost.append(LostValueRecord(arm=arm, metric=metric, seed=seed, why=why))
    return lost


def first_error(runs: list[RunRecord]) -> str | None:
    """'where: Type: message' of the first failed run's error (its last frame), else its detail's first line."""
    for r in runs:
        error = r.error
        if r.status == "failed" and error is not None and error.type:
            where = f"{error.where}: " if error.where else ""
            return f"{where}{error.type}: {error.message}"
    for r in runs:
        if r.status in ("failed", "skipped") and r.halt_detail:
            return r.halt_detail.splitlines()[0][:300]
    return None


def _not_run(
    arms: list[str], runs: list[RunRecord], seeds: list[int] | None, under_test: set[str]
) -> list[NotRunRecord]:
    """The arms read by the decision or a control that have no completed run among the expected seeds
    (a futility halt of an arm under test excepted: that is a designed outcome, which refutes)."""
    expected = _expected(runs, seeds)
    out = []
    for arm in arms:
        mine = [r for r in runs if r.arm == arm and r.seed in expected]
        if not expected or any(r.status == "completed" for r in mine):
            continue
        if arm in under_test and any(_is_futility(r.halt_reason) for r in mine):
            continue
        statuses: dict[str, int] = {}
        for r in mine:
            statuses[r.status or "?"] = statuses.get(r.status or "?", 0) + 1
        if len(expected) > len(mine):
            statuses["not recorded"] = len(expected) - len(mine)
        error = first_error(mine)
        text = (
            f"0 of {len(expected)} runs completed ("
            + ", ".join(f"{n} {_status_words(s)}" for s, n in statuses.items())
            + ")"
            + (f"; first error: {error}" if error else "")
        )
        settle = (
            "find and fix what fails"
            + (f" ({error})" if error else "")
            + ", then record a new attempt "
            "(`gates run CONTRACT --record --reason TEXT`; this one stays on the record)"
        )
        out.append(
            NotRunRecord(
                arm=arm,
                runs=len(expected),
                completed=0,
                statuses=statuses,
                first_error=error,
                text=text,
                settle=settle,
            )
        )
    return out


def _status_words(status: str) -> str:
    return {"skipped": "not run after its arm kept failing", "halted": "halted by a stop rule"}.get(
        status, status
    )


def _run_notes(
    runs: list[RunRecord], read, under_test: set[str], seeds, not_run: list[NotRunRecord]
) -> list[str]:
    """A line per run the decision reads that did not complete, and one per other arm with failures."""
    read_arms = {a for a, _ in read}
    broken_arms = {x.arm for x in not_run}
    notes = []
    for r in runs:
        if r.arm not in read_arms or r.arm in broken_arms or r.status == "completed":
            continue
        if r.status not in ("failed", "killed", "halted", "skipped"):
            continue
        if r.arm in under_test and _is_futility(r.halt_reason):
            continue
        why = first_error([r]) if r.status in ("failed", "skipped") else r.halt_reason
        notes.append(
            f"arm {r.arm} seed {r.seed} did not complete ({r.status}"
            f"{': ' + str(why) if why else ''}); its values are missing"
        )
    others: dict[str, list[RunRecord]] = {}
    for r in runs:
        if r.arm not in read_arms and r.status in ("failed", "skipped"):
            others.setdefault(r.arm, []).append(r)
    for arm, bad in others.items():
        total = len([r for r in runs if r.arm == arm])
        notes.append(
            f"arm {arm} (not read by the decision) did not complete {len(bad)} of {total} runs; first error: "
            f"{first_error(bad) or '-'}"
        )
    return notes


def _beyond_ceiling(
    results, listed, ceilings: Mapping[str, CeilingRef | dict], samples, metrics
) -> list[BeyondCeilingRecord]:
    """The conditions whose bar (in the metric's better direction) the best possible arm does not reach:
    its ceiling, a value known before the run, or measured per seed by a metric the arm reports or by an
    oracle arm, is no better than the bar on the condition's scale."""
    out = []
    for r, (_, _, c) in zip(results, listed):
        ceiling = ceilings.get(r.label)
        spec = metrics.get(getattr(c, "metric", None) or "")
        if ceiling is None or isinstance(c, Trend) or spec is None or c.direction != spec.direction:
            continue
        ceiling = _ceiling(ceiling)
        if ceiling.value is not None:
            values, source = [float(ceiling.value)], "known before the run"
        elif ceiling.metric:
            values, source = (
                list(samples.get((c.arm, ceiling.metric), {}).values()),
                f"{c.arm}.{ceiling.metric}",
            )
        else:
            values, source = (
                list(samples.get((ceiling.arm, c.metric), {}).values()),
                f"{ceiling.arm}.{c.metric}",
            )
        if not values:
            continue
        log = r.scale == "log" and all(v > 0 for v in values)
        centre = float(np.exp(np.mean(np.log(values)))) if log else float(np.mean(values))
        effect = _effects(c, log)[0]
        best = effect.const + effect.terms[0].coef * (math.log(centre) if log else centre)
        if len(effect.terms) > 1:
            other = list(samples.get((effect.terms[1].arm, effect.terms[1].metric), {}).values())
            if not other:
                continue
            other_centre = float(np.mean(np.log(other))) if log else float(np.mean(other))
            best += effect.terms[1].coef * other_centre
        if best > 0:
            continue
        shown = (
            f"{min(values):.4g}-{max(values):.4g} over {len(values)} seeds (centre {centre:.4g})"
            if len(values) > 1
            else f"{centre:.4g}"
        )
        out.append(
            BeyondCeilingRecord(
                condition=r.label,
                description=r.description,
                ceiling=centre,
                min=min(values),
                max=max(values),
                source=source,
                why=ceiling.why,
                text=f"{r.label} `{r.description}`: the best possible arm reaches {shown} ({source}: "
                f"{ceiling.why}), which does not clear the bar: the condition tests nothing",
                settle=f"{r.label}: the claim as stated asks more than the best possible arm reaches here; a "
                f"new version needs a claim (or a regime) where the ceiling clears the bar",
            )
        )
    return out


def _ceiling(ceiling: CeilingRef | dict) -> CeilingRef:
    """A condition's ceiling as the contract types it (`CeilingRef`): the contract's own as it is; one
    given as data (`LoadedContract.ceilings`: the contract's dumped, or what the study knows, `Study.ceiling`,
    each checked where it was declared) read into one as it is, without a second check (a study's `why` may
    be empty, where the contract's may not; absent: empty)."""
    if isinstance(ceiling, CeilingRef):
        return ceiling
    return CeilingRef.model_construct(**{"why": ""} | dict(ceiling))


def _is_futility(halt_reason) -> bool:
    return str(halt_reason or "").startswith("futility")
