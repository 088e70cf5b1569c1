"""The re-derive phase of a claim's check, and `gates verify`.

`check_claim` starts with the files phase (`check_files`: the evidence's shape, the repository's
contract for its id and its hash, verdict.md) and then checks what the files alone cannot: the runs
are exactly the contract's arms x seeds, each once; the settings, claim text and gate-5 point are the
contract's; the verdict, every condition's values, estimate, interval and p-values, the reasons and
what would settle it equal what today's code derives from the recorded per-seed metrics; the tuning
record; with replay, contracts marked `replay: {ci: true}` are re-run and must give the same verdict
and metrics within their tolerance. `verify` runs it on every claim (`claims`), then the audit.

What verify cannot know from the files alone: per-seed values edited consistently with everything
derived from them, the git commit, code hash, timings and preflight measurements recorded (see the
README's "Reliability" section).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from gates.contract import LoadedContract, load_contract, load_contract_cached
from gates.design import rule_flags
from gates.entities import Verdict
from gates.errors import UserError
from gates.inference import claim_inputs
from gates.record import (
    Derivation,
    Evidence,
    attempt_verdicts,
    best_trial,
    derive,
    family_of,
    is_converged,
    tuned_config,
)
from gates.verify import _audit as audit
from gates.verify._claim import (
    BEFORE_HASH,
    CONTRACT_EDITED,
    CONTRACT_UNLOADABLE,
    CONVERGENCE,
    DERIVED,
    FAMILY,
    MACHINE_BOUND,
    REPLAY,
    RUNS,
    SETTINGS,
    TUNING,
    VERDICT,
    ClaimCheck,
)
from gates.verify._claims import (
    ContractIndex,
    check_files,
    claims,
    find_contracts,
    lose_history,
)
from gates.verify._lineage import check_lineage
from gates.verify._replay import check_refusals, replay_pool, replay_problems


def check_claim(
    evidence_path: Path, contracts: ContractIndex, *, replay: bool, processes=None
) -> ClaimCheck:
    """Check one claim: the files phase (`check_files`), then the re-derive phase: the runs (exactly
    the contract's arms x seeds, each once), the settings and claim text (the contract's), everything
    derived from the per-seed values (re-derived by today's code), verdict.md (the rendering of the
    evidence), the tuning record and, with `replay`, a re-run of a contract marked for it. Every
    problem found is named; a claim decided on machine metrics is named as not re-checkable
    (MACHINE_BOUND), not lost."""
    check, ev, loaded = check_files(evidence_path, contracts)
    if any(code in BEFORE_HASH or code == CONTRACT_EDITED for code in check.codes):
        return check  # no usable contract (or evidence) to re-derive with
    if loaded is None:
        try:
            loaded = load_contract(contracts[check.contract_id])
        except UserError as e:
            check.lose(
                CONTRACT_UNLOADABLE, [f"contract no longer loads: {e.render().splitlines()[0]}"]
            )
            return check
    if loaded.sha256 != ev.contract_sha256:  # its study's config makes something else of it
        check.hash_ok = False
        check.lose(
            CONTRACT_EDITED,
            [
                f"{loaded.path} loads to sha256 {loaded.sha256[:16]} != recorded "
                f"{ev.contract_sha256[:16]} (its study's arm config changed what it makes of it)"
            ],
        )
        return check
    check.rederived = True
    family = family_of(
        loaded.contract,
        evidence_path.parent.parent,
        Path(contracts[check.contract_id]).parent,
        attempt_verdicts(ev)[:-1],
    )
    # the tuning record as stored (plain JSON), as a run and `gates rederive` hand it on
    tuning = ev.tuning.as_dict() if ev.tuning is not None else None
    loaded = loaded.replace(tuning_record=tuning, family=family)
    # what `gates run` and `gates rederive` derive from these runs (gates.record.derive), compared
    derived = derive(loaded, ev, tuning=tuning)
    check.lose(FAMILY, _check_family(loaded, ev, derived.data.get("family")))
    check.lose(RUNS, _check_runs(loaded, ev))
    check.lose(CONVERGENCE, _check_convergence(loaded, ev))
    check.lose(SETTINGS, _check_settings(loaded, ev, derived.data))
    check.lose(VERDICT, _rederive(derived.verdict, ev))
    check.lose(DERIVED, _check_derived(ev, derived))
    if loaded.contract.tuning is not None or tuning:
        check.lose(TUNING, _check_tuning(loaded, ev))
    bound = audit.machine_bound(loaded)
    if bound:  # said, never lost: the record is what it is; no re-run can vouch for these
        check.add(
            MACHINE_BOUND,
            f"not re-checkable by a re-run: its conditions read {', '.join(bound)}, machine "
            f"metrics of study {loaded.study.name!r} (they measure the machine that ran it); "
            f"replays and audits compare its other metrics only",
        )
    if replay and loaded.contract.replay and loaded.contract.replay.ci:
        check.replayed = True
        audit.file_differences(check, REPLAY, replay_problems(loaded, ev, processes), ev.runs)
    return check


def _check_family(loaded: LoadedContract, ev: Evidence, want: dict | None) -> list[str]:
    """The claim family the evidence records is the one the record of its earlier versions gives
    (`want`, as derived): the same versions, each having spent the same alpha, and so the same level
    (an earlier version erased or added since would change what this one was judged at)."""
    have = ev.family.as_dict() if ev.family is not None else None
    if have == want:
        return []
    if want is None:
        return [f"its evidence records a claim family ({_short(have)}) the record does not give it"]
    return [
        f"its claim family is {loaded.family.describe(loaded.contract.decision.alpha)}, but its evidence "
        f"records {_short(have) if have else 'none'}: re-derive it (gates rederive)"
    ]


def _rederive(again: Verdict, ev: Evidence) -> list[str]:
    """The verdict and each condition's outcome against `again`, re-derived from the recorded runs."""
    problems = []
    if again.verdict != ev.verdict:
        problems.append(
            f"recorded verdict {ev.verdict!r} does not reproduce from its metrics: "
            f"today's code says {again.verdict!r}"
        )
    recorded = {(c.list_name, c.index): c.outcome for c in ev.conditions}
    for c in again.conditions:
        was = recorded.get((c.list_name, c.index))
        if was != c.outcome:
            problems.append(
                f"{c.list_name}[{c.index}] `{c.description}`: recorded {was!r}, re-derived {c.outcome!r}"
            )
    return problems


# ---------------------------------------------------------------------------------- record checks
REL_TOL, ABS_TOL = (
    1e-9,
    1e-12,
)  # recorded vs re-derived floats: the same computation, up to rounding
SHOWN = 4  # arm x seeds named per problem line
# condition fields that verdict.md and the dashboard show: a record without one hides it. Other fields
# that today's code derives may be absent (evidence recorded before the field existed), never different.
SHOWN_CONDITION_FIELDS = (
    "description",
    "outcome",
    "estimate",
    "ci_low",
    "ci_high",
    "p_hold_adj",
    "p_fail_adj",
    "test",
    "values",
)
OPTIONAL_DERIVED = (
    "not_run",
    "beyond_ceiling",
    "tuning_edges",
)  # engine 3's, written only when not empty
DERIVED_TOP_LEVEL = (
    "reasons",
    "settle",
    "halts",
    "lost",
    "controls",
    "looks",
) + OPTIONAL_DERIVED  # the verdict's own fields, where recorded


def _check_runs(loaded: LoadedContract, ev: Evidence) -> list[str]:
    """The runs are exactly the contract's arms x seeds, each once; for a sequential contract, the arms x
    seeds of the looks taken, up to the look the sequence stops at on these runs (re-derived), or of whole
    later looks: an engine that decided later than today's (re-derived since) ran them, and the verdict
    is the first deciding look's all the same."""
    from collections import Counter

    arms, seeds = list(loaded.contract.arms), list(loaded.contract.seeds)
    if loaded.contract.sequential is not None:
        from gates.inference import stopping_seeds

        seeds = stopping_seeds(
            loaded.contract,
            ev.runs,
            loaded.study.metrics,
            **claim_inputs(loaded),
        )
        taken = {r.seed for r in ev.runs}
        later = [n for n in loaded.contract.sequential.looks if n > len(seeds)]
        seeds = next(
            (
                list(loaded.contract.seeds)[:n]
                for n in later
                if set(loaded.contract.seeds[:n]) == taken
            ),
            seeds,
        )
    expected = [(a, s) for a in arms for s in seeds]
    counts = Counter((r.arm, r.seed) for r in ev.runs)
    problems = []

    def names(keys):
        shown = ", ".join(f"{a}/seed {s}" for a, s in keys[:SHOWN])
        return shown + (f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")

    missing = [k for k in expected if not counts[k]]
    extra = [k for k in counts if k not in set(expected)]
    twice = [k for k, n in counts.items() if n > 1 and k in set(expected)]
    if missing:
        problems.append(
            f"runs lack {names(missing)}: the evidence has {len(ev.runs)} runs, the contract's "
            f"{len(arms)} arms x {len(seeds)} seeds are {len(expected)} (each arm runs on every seed)"
        )
    if extra:
        listed = (
            "which the contract does not list"
            if loaded.contract.sequential is None
            else (
                "beyond the look at which the sequence stops on these runs (or not the contract's)"
            )
        )
        problems.append(
            f"runs include {names(extra)}, {listed} (arms {', '.join(arms)}; seeds {seeds})"
        )
    if twice:
        problems.append(f"runs list {names(twice)} more than once; expected each arm x seed once")
    return problems


def _check_convergence(loaded: LoadedContract, ev: Evidence) -> list[str]:
    """Under a convergence rule every completed run records `converged` and the trend it was judged on
    (the rule's metric and window), and the flag is what the rule says of that trend; halted and failed
    runs, and every run of a contract without the rule, record none."""
    rule = loaded.contract.convergence
    problems = []
    for r in ev.runs:
        name = f"run {r.arm}/seed {r.seed}"
        if rule is None or r.status != "completed":
            if r.has("converged") or r.has("convergence"):
                why = (
                    "the contract has no convergence rule" if rule is None else f"it is {r.status}"
                )
                problems.append(f"{name} records convergence, but {why}; expected none")
            continue
        conv = r.convergence
        if not isinstance(r.converged, bool) or conv is None:
            problems.append(
                f"{name} completed without a convergence record; expected converged and convergence "
                f"under the contract's convergence rule"
            )
            continue
        if conv.metric != rule.metric or conv.window != rule.window:
            problems.append(
                f"{name} was judged on {conv.metric!r} over {conv.window} steps; the "
                f"contract's rule is {rule.metric!r} over {rule.window}"
            )
        elif r.converged != is_converged(rule, conv):
            problems.append(
                f"{name} records converged={str(r.converged).lower()}, but its trend "
                f"({conv.rel_improvement} relative over the window, bar "
                f"{rule.max_rel_improvement:g}) gives converged={str(not r.converged).lower()}"
            )
    return problems


def _check_settings(loaded: LoadedContract, ev: Evidence, derived: dict) -> list[str]:
    """The settings, claim and gate-5 point recorded are the contract's, the design and regime what
    `derived` (the evidence as derived today) gives (a tuned arm's config is checked by `_check_tuning`
    against the declared one with the best trial's params)."""
    c = loaded.contract
    s = ev.settings
    problems = []
    for key, got, want in (
        ("claim", ev.claim, c.claim),
        ("source", ev.source, c.source),
        ("study", ev.study, c.study),
    ):
        if got != want:
            problems.append(
                f"the recorded {key} is not the contract's: {_short(got)} != {_short(want)}"
            )
    for key, got, want in (
        ("alpha", s.alpha, c.decision.alpha),
        ("evaluation", s.evaluation, c.decision.evaluation),
        ("seeds", s.seeds, list(c.seeds)),
    ):
        if not _same(got, want):
            problems.append(f"settings.{key} {_short(got)} is not the contract's {_short(want)}")
    problems += _stated_problems(
        "settings.budget", s.budget.as_dict(), c.budget, "the contract's budget"
    )
    recorded = s.arm_configs
    if sorted(recorded) != sorted(loaded.arm_configs):
        problems.append(
            f"settings.arm_configs covers arms {sorted(recorded)}, the contract has {sorted(loaded.arm_configs)}"
        )
    tuned = set(c.tuning.tuned_arms(c.arms)) if c.tuning is not None else set()
    for arm, cfg in loaded.arm_configs.items():
        if arm in recorded and arm not in tuned:
            problems += _stated_problems(
                f"settings.arm_configs.{arm}", recorded[arm], cfg, "the study's config"
            )
    design = ev.design.as_dict() if ev.design is not None else None
    for key, got, want in (
        ("design", design, derived.get("design")),
        ("regime", ev.regime, derived.get("regime")),
    ):
        if not _same(got or None, want or None):
            problems.append(
                f"the recorded {key} {_short(got)} is not the contract's {_short(want)}"
            )
    if ev.falsifiable_point is not None:  # compared with the contract's as plain JSON
        point = ev.falsifiable_point.as_dict()
        want = c.preflight.falsifiable_point.model_dump(exclude={"statement"})
        for key, value in want.items():
            if not _same(point.get(key), value):
                problems.append(
                    f"falsifiable_point.{key} {_short(point.get(key))} is not the contract's {_short(value)}"
                )
        signals = [
            {"seed": r.seed, **r.first_signal.as_dict()}
            for r in ev.runs
            if r.first_signal is not None
        ]
        if not _same(point.get("runs", []), signals):
            problems.append("falsifiable_point.runs is not what the runs' first signals record")
    return problems


def _check_tuning(loaded: LoadedContract, ev: Evidence) -> list[str]:
    """The tuning record agrees with the contract and with itself: every tuned arm has exactly the
    pre-registered number of trials, the recorded best is the best of them, and the arm config that
    ran over the seeds is the declared one with the best params."""
    t, rec = loaded.contract.tuning, ev.tuning
    recorded = rec is not None and bool(rec.as_dict())  # an empty record is none
    if t is None:
        return (
            ["evidence has a tuning record but the contract has no tuning section"]
            if recorded
            else []
        )
    if not recorded:
        return ["the contract tunes its arms but the evidence has no tuning record"]
    problems = []
    tuned = t.tuned_arms(loaded.contract.arms)
    if sorted(rec.arms) != sorted(tuned):
        problems.append(
            f"tuning record covers arms {sorted(rec.arms)}, the contract tunes {sorted(tuned)}"
        )
    for arm, r in rec.arms.items():
        if len(r.trials) != t.trials_per_arm:
            problems.append(
                f"tuning of {arm!r} records {len(r.trials)} trials, the contract's budget is "
                f"{t.trials_per_arm}"
            )
        best = best_trial(r.trials, t.objective.direction)
        recorded_best = r.best.number if r.best else None
        if (best.number if best else None) != recorded_best:
            problems.append(
                f"tuning of {arm!r}: recorded best trial {recorded_best}, "
                f"re-derived {best and best.number}"
            )
        if arm not in loaded.contract.arms:
            continue
        config = tuned_config(loaded, arm, r.best.params if r.best else {})
        expected, stated = (
            config.model_dump(mode="json"),
            config.model_dump(mode="json", exclude_unset=True),
        )
        ran = ev.settings.arm_configs.get(arm)
        if (
            ran is not None
        ):  # a field the study's config gained since (at its default) is no difference
            expected = {k: v for k, v in expected.items() if k in ran or k in stated}
        if ran is not None and json.dumps(ran, sort_keys=True) != json.dumps(
            expected, sort_keys=True
        ):
            problems.append(
                f"arm {arm!r} ran a config that is not its declared one with the best trial's params"
            )
    return problems


def _stated_problems(where: str, recorded: dict, model, what: str) -> list[str]:
    """A recorded config (arm config, budget) against the contract's (validated, defaults filled in).
    A field that the model gained since (absent from the record, not set by the contract) is no
    difference; any other field must be recorded with the contract's value."""
    want = model.model_dump(mode="json")
    stated = model.model_dump(mode="json", exclude_unset=True)
    problems = []
    for key in sorted(set(want) | set(recorded)):
        if key not in recorded and key not in stated:
            continue
        if key not in want:
            problems.append(f"{where}.{key} is recorded but is no field of {what}")
        elif key not in recorded or not _same(recorded[key], want[key]):
            problems.append(
                f"{where}.{key} {_short(recorded.get(key, '(absent)'))} is not the contract's "
                f"{_short(want[key])}"
            )
    return problems


def _check_derived(ev: Evidence, derivation: Derivation) -> list[str]:
    """Everything the verdict engine derives from the per-seed values (each condition's values, n,
    estimate, interval and p-values; the reasons, what would settle it, the halts; the correction)
    equals what today's code derives from the recorded runs, floats within a relative 1e-9. Verdict
    and outcomes are `_rederive`'s. Gates 3 and 5 as measured (`predictions`) likewise, where recorded.
    `ev`: the evidence as read; its fields and conditions are compared as stored (plain JSON:
    `as_dict()`), key by key with the re-derived `Verdict.to_dict()` (`derivation`: gates.record.derive
    of these runs)."""
    again = derivation.verdict
    problems = []
    if ev.settings.correction != again.correction:
        problems.append(
            f"settings.correction {ev.settings.correction!r} is not today's {again.correction!r}"
        )
    derived = again.to_dict()
    if ev.has("predictions"):
        derived["predictions"] = derivation.data["predictions"]
    stored = ev.as_dict()
    for key in OPTIONAL_DERIVED:  # recorded only when not empty: absent and empty are the same
        stored[key] = stored.get(key) or type(derived[key])()
    for key in DERIVED_TOP_LEVEL + ("predictions",):
        if key in stored and key in derived and not _same(stored[key], derived[key]):
            problems.append(
                f"the recorded {key} are not what the runs give: {_diff(stored[key], derived[key])}"
            )
    return problems + _check_conditions(ev, again)


def _check_conditions(ev: Evidence, again: Verdict) -> list[str]:
    """Each recorded condition against the re-derived one (`again`), field by field as stored."""
    problems = []
    recorded = {}
    for c in ev.conditions:
        if c.label in recorded:
            problems.append(f"conditions list {c.label} twice")
        recorded[c.label] = c.as_dict()
    fresh = {c.label: c for c in again.conditions}
    for label in recorded.keys() - fresh.keys():
        problems.append(f"conditions include {label}, which the contract's decision does not have")
    for label, condition in fresh.items():
        want = condition.as_dict()
        got = recorded.get(label)
        if got is None:
            continue  # `_rederive` names a missing condition
        for key, value in want.items():
            if key == "outcome":
                continue  # `_rederive` compares outcomes
            if key not in got:
                if key in SHOWN_CONDITION_FIELDS:
                    problems.append(
                        f"{label}: the record lacks {key} (the runs give {_short(value)})"
                    )
                continue
            if not _same(got[key], value):
                problems.append(
                    f"{label} `{condition.description}`: recorded {key} {_short(got[key])}, the recorded "
                    f"runs give {_short(value)}"
                )
    return problems


def _same(a, b) -> bool:
    """Equal as JSON data, floats within REL_TOL (ints and floats compare as numbers, bools do not)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _diff(got, want) -> str:
    if isinstance(got, list) and isinstance(want, list):
        for i, (x, y) in enumerate(zip(got, want)):
            if not _same(x, y):
                return f"item {i}: recorded {_short(x)}, the runs give {_short(y)}"
        return f"{len(got)} recorded, the runs give {len(want)}"
    return f"recorded {_short(got)}, the runs give {_short(want)}"


def _short(x, limit: int = 100) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def verify(
    runs_root: Path,
    contracts_root: Path,
    only: list[Path] | None = None,
    *,
    replay: bool = False,
    strict_code: bool = False,
    audit_seconds: float | None = None,
    audit_seed: int | None = None,
    audit_tolerance: tuple[float, float] | None = None,
    jobs: int = 1,
    log=None,
) -> list[ClaimCheck]:
    """`gates verify`: every claim checked whole (`claims` with `check_claim`), then, with `audit_seconds`,
    completed runs of the claims not replayed here (with `replay`, the ones marked for CI replay are)
    re-run in a seeded order within that many seconds (gates.verify._audit; `audit_seed` fixes the
    order, else it comes from the git commit;
    `audit_tolerance` (abs, rel) for contracts without a `replay` section, else `Replay()`'s); `jobs`:
    the replays' runs in that many local processes (started once for all of them); `log` receives the
    audit's plan and results line by line."""
    with replay_pool(jobs if replay else 1) as processes:
        checks = claims(
            runs_root,
            contracts_root,
            only,
            deep=lambda evidence, contracts: check_claim(
                evidence, contracts, replay=replay, processes=processes
            ),
            today_rules=today_rule_flags,
            strict_code=strict_code,
            check_contract=lambda path: check_refusals(path, runs_root, contracts_root),
        )
    lineage = check_lineage(Path(runs_root))  # the history only grew across the git commits
    lose_history(checks, lineage.problems, named=bool(only))
    for note in lineage.notes if log is not None else ():
        log(f"history: {note}")
    if audit_seconds:
        contracts = find_contracts(Path(contracts_root))
        for path in only or []:
            contracts[load_contract(path).id] = Path(path)
        audit.audit(
            checks,
            Path(runs_root),
            contracts,
            audit_seconds,
            seed=audit_seed,
            log=log,
            default_tolerance=audit_tolerance,
        )
    return checks


def today_rule_flags(path: Path) -> list[str] | None:
    """The design rules a contract breaks by today's rules (None when it does not load)."""
    loaded = load_contract_cached(path)
    return rule_flags(loaded) if loaded is not None else None
