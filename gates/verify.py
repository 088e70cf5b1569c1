"""`gates verify`: does every claim in runs/ still hold its evidence?

For each `runs/<id>/evidence.json` (`check_claim`): the evidence has the shape its readers rely on;
the repository's contract with that id (found by scanning the contracts folder, never at a path the
evidence names) exists, is the only one with that id, and hashes to what the evidence recorded; the
runs are exactly the contract's arms x seeds, each once; the settings, claim text and gate-5 point
are the contract's; the verdict, every condition's values, estimate, interval and p-values, the
reasons and what would settle it equal what today's code derives from the recorded per-seed metrics;
verdict.md is exactly the rendering of the evidence; with replay, contracts marked
`replay: {ci: true}` are re-run and must give the same verdict and metrics within their tolerance.

What verify cannot know from the files alone: per-seed values edited consistently with everything
derived from them, the git commit, code hash, timings and preflight measurements recorded (see the
README's "Reliability" section).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gates import audit, ledger, siblings, verdict
from gates.contract import LoadedContract, load_contract, load_contract_cached
from gates.errors import UserError
from gates.provenance import describe_stale


@dataclass
class ClaimCheck:
    contract_id: str
    status: str  # "ok" | "lost" | "pending" | "withdrawn"
    verdict: str | None = None
    created_at: str | None = None
    problems: list[str] = field(default_factory=list)
    replayed: bool = False
    hash_ok: bool | None = (
        None  # the contract's sha256 against the recorded one; None: not compared
    )
    # the claims history and the code, filled in by verify() (gates.history, gates.provenance, gates.audit)
    withdrawn: bool = (
        False  # the index's latest entry for this id is a withdrawal (status "withdrawn")
    )
    withdrawal: str | None = None  # its reason and time
    supersedes: str | None = None  # the id this contract replaces
    superseded_by: list[str] = field(
        default_factory=list
    )  # ids of the contracts that replace this one
    stale: bool = False  # the code the evidence was computed with has changed since
    stale_files: list[str] = field(
        default_factory=list
    )  # which files ("unknown files" when not nameable)
    stale_note: str = ""
    rule_flags: list[str] = field(default_factory=list)  # rules the recorded contract predates
    audited: list[str] = field(
        default_factory=list
    )  # runs re-run by a spot-check audit, with their outcome
    attempts: int = 0  # attempts at this claim in the claims history (gates.history.attempts)
    earlier: list[str] = field(
        default_factory=list
    )  # each earlier attempt in a line ("attempt 1 invalid (...)")
    shared_runs: dict[str, list[str]] = field(
        default_factory=dict
    )  # other claim -> runs it ran too (gates.siblings)
    regime_left: siblings.RegimeLeft | None = None  # a superseded sibling left this claim's regime

    def as_dict(self) -> dict:
        return self.__dict__.copy()


class ContractIndex(dict):
    """contract id -> path of the contract file with that id (a dict), and what the scan found wrong:
    `duplicates` (id -> every file that has it) and `unloadable` (path -> its first error line)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.duplicates: dict[str, list[Path]] = {}
        self.unloadable: dict[Path, str] = {}


def find_contracts(contracts_root: Path) -> dict[str, Path]:
    """contract id -> path, for every contract file that loads (a ContractIndex: files that do not
    load, and ids that several files claim, are kept aside for `check_claim` to report)."""
    found = ContractIndex()
    for path in sorted(list(contracts_root.glob("*.yaml")) + list(contracts_root.glob("*.yml"))):
        try:
            contract_id = load_contract(path).id
        except UserError as e:
            found.unloadable[path] = e.render().splitlines()[0]
            continue
        if contract_id in found:
            found.duplicates.setdefault(contract_id, [found[contract_id]]).append(path)
        found[contract_id] = path
    return found


def check_claim(evidence_path: Path, contracts: dict[str, Path], *, replay: bool) -> ClaimCheck:
    """Check one claim's evidence against the repository's contract for its id (found by scanning the
    contracts folder, never at a path the evidence names): the evidence's shape, the contract's
    sha256, the runs (exactly the contract's arms x seeds, each once), the settings and claim text
    (the contract's), everything derived from the per-seed values (re-derived by today's code), and
    verdict.md (the rendering of the evidence). Every problem found is named."""
    contract_id = evidence_path.parent.name
    check = ClaimCheck(contract_id, "ok")
    try:
        ev = ledger.read_evidence(evidence_path)
    except ValueError as e:
        return _lost(
            check,
            f"{evidence_path}: {e}; expected valid evidence: restore the committed file from git, "
            f"or run the contract again",
        )
    check.verdict, check.created_at = ev["verdict"], ev["created_at"]
    if ev["contract_id"] != contract_id:
        return _lost(
            check, f"{evidence_path} records contract {ev['contract_id']!r}, not {contract_id!r}"
        )

    # the contract is the repository's file with this id: a path the evidence names is never trusted
    duplicates = getattr(contracts, "duplicates", {}).get(contract_id)
    if duplicates:
        return _lost(
            check,
            f"contracts {', '.join(map(str, duplicates))} all have id {contract_id!r}; expected "
            f"exactly one contract per id (a new version needs a new id)",
        )
    path = contracts.get(contract_id)
    if path is None or not Path(path).is_file():
        broken = [
            (p, why)
            for p, why in getattr(contracts, "unloadable", {}).items()
            if p.stem == contract_id
        ]
        if broken:
            return _lost(check, f"contract no longer loads: {broken[0][1]}")
        return _lost(
            check,
            f"contract {contract_id!r} is missing (recorded at {ev.get('contract_path')}); no "
            f"contract file in the contracts folder has this id",
        )
    try:
        loaded = load_contract(path)
    except UserError as e:
        return _lost(check, f"contract no longer loads: {e.render().splitlines()[0]}")
    if loaded.id != contract_id:
        return _lost(check, f"{path} now has id {loaded.id!r}")
    check.hash_ok = loaded.sha256 == ev["contract_sha256"]
    if not check.hash_ok:
        named = ev.get("contract_path")
        elsewhere = (
            f"; the evidence names {named}, but the contract with id {contract_id!r} is {path}"
            if named and not _same_file(named, path)
            else ""
        )
        return _lost(
            check,
            f"{path} was edited after its evidence: sha256 {loaded.sha256[:16]} != recorded "
            f"{ev['contract_sha256'][:16]} (a new version needs a new id){elsewhere}",
        )

    loaded.tuning_record = ev.get("tuning")
    check.problems += _check_runs(loaded, ev)
    check.problems += _check_convergence(loaded, ev)
    check.problems += _check_settings(loaded, ev)
    again = verdict.judge_claim(loaded, ev["runs"])
    check.problems += _rederive(again, ev)
    check.problems += _check_derived(loaded, ev, again)
    check.problems += _check_report(evidence_path.parent, ev)
    if loaded.contract.tuning is not None or ev.get("tuning"):
        from gates.tuning import (
            check_evidence as check_tuning,
        )  # imports Optuna: only when it matters

        check.problems += check_tuning(loaded, ev)
    if replay and loaded.contract.replay and loaded.contract.replay.ci:
        check.replayed = True
        check.problems += _replay(loaded, ev)
    if check.problems:
        check.status = "lost"
    return check


def _same_file(recorded: str, path: Path) -> bool:
    try:
        return Path(recorded).resolve() == Path(path).resolve()
    except OSError:
        return False


def _lost(check: ClaimCheck, problem: str) -> ClaimCheck:
    check.status = "lost"
    check.problems.append(problem)
    return check


def _rederive(again: verdict.Verdict, ev: dict) -> list[str]:
    """The verdict and each condition's outcome against `again`, re-derived from the recorded runs."""
    problems = []
    if again.verdict != ev["verdict"]:
        problems.append(
            f"recorded verdict {ev['verdict']!r} does not reproduce from its metrics: "
            f"today's code says {again.verdict!r}"
        )
    recorded = {(c["list_name"], c["index"]): c["outcome"] for c in ev["conditions"]}
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


def _check_runs(loaded: LoadedContract, ev: dict) -> list[str]:
    """The runs are exactly the contract's arms x seeds, each once; for a sequential contract, the arms x
    seeds of the looks taken, up to the look the sequence stops at on these runs (re-derived), or of whole
    later looks: an engine that decided later than today's (re-derived since) ran them, and the verdict
    is the first deciding look's all the same."""
    from collections import Counter

    arms, seeds = list(loaded.contract.arms), list(loaded.contract.seeds)
    if loaded.contract.sequential is not None:
        from gates.sequential import stopping_seeds

        seeds = stopping_seeds(
            loaded.contract, ev["runs"], loaded.study.metrics, **verdict.claim_inputs(loaded)
        )
        taken = {r["seed"] for r in ev["runs"]}
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
    counts = Counter((r["arm"], r["seed"]) for r in ev["runs"])
    problems = []

    def names(keys):
        shown = ", ".join(f"{a}/seed {s}" for a, s in keys[:SHOWN])
        return shown + (f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")

    missing = [k for k in expected if not counts[k]]
    extra = [k for k in counts if k not in set(expected)]
    twice = [k for k, n in counts.items() if n > 1 and k in set(expected)]
    if missing:
        problems.append(
            f"runs lack {names(missing)}: the evidence has {len(ev['runs'])} runs, the contract's "
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


def _check_convergence(loaded: LoadedContract, ev: dict) -> list[str]:
    """Under a convergence rule every completed run records `converged` and the trend it was judged on
    (the rule's metric and window), and the flag is what the rule says of that trend; halted and failed
    runs, and every run of a contract without the rule, record none."""
    from gates.rules import is_converged

    rule = loaded.contract.convergence
    problems = []
    for r in ev["runs"]:
        name = f"run {r['arm']}/seed {r['seed']}"
        if rule is None or r.get("status") != "completed":
            if "converged" in r or "convergence" in r:
                why = (
                    "the contract has no convergence rule"
                    if rule is None
                    else f"it is {r.get('status')}"
                )
                problems.append(f"{name} records convergence, but {why}; expected none")
            continue
        conv = r.get("convergence")
        if not isinstance(r.get("converged"), bool) or not isinstance(conv, dict):
            problems.append(
                f"{name} completed without a convergence record; expected converged and convergence "
                f"under the contract's convergence rule"
            )
            continue
        if conv.get("metric") != rule.metric or conv.get("window") != rule.window:
            problems.append(
                f"{name} was judged on {conv.get('metric')!r} over {conv.get('window')} steps; the "
                f"contract's rule is {rule.metric!r} over {rule.window}"
            )
        elif r["converged"] != is_converged(rule, conv):
            problems.append(
                f"{name} records converged={str(r['converged']).lower()}, but its trend "
                f"({conv.get('rel_improvement')} relative over the window, bar "
                f"{rule.max_rel_improvement:g}) gives converged={str(not r['converged']).lower()}"
            )
    return problems


def _check_settings(loaded: LoadedContract, ev: dict) -> list[str]:
    """The settings, claim and gate-5 point recorded are the contract's (a tuned arm's config is checked
    by gates.tuning against the declared one with the best trial's params)."""
    c = loaded.contract
    s = ev["settings"]
    problems = []
    for key, want in (("claim", c.claim), ("source", c.source), ("study", c.study)):
        if ev.get(key) != want:
            problems.append(
                f"the recorded {key} is not the contract's: {_short(ev.get(key))} != {_short(want)}"
            )
    for key, got, want in (
        ("alpha", s["alpha"], c.decision.alpha),
        ("evaluation", s["evaluation"], c.decision.evaluation),
        ("seeds", s["seeds"], list(c.seeds)),
    ):
        if not _same(got, want):
            problems.append(f"settings.{key} {_short(got)} is not the contract's {_short(want)}")
    problems += _stated_problems("settings.budget", s["budget"], c.budget, "the contract's budget")
    recorded = s["arm_configs"]
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
    from gates.runner import design_of
    from gates.siblings import regime_of

    for key, want in (("design", design_of(c)), ("regime", regime_of(loaded))):
        if not _same(ev.get(key) or None, want or None):
            problems.append(
                f"the recorded {key} {_short(ev.get(key))} is not the contract's {_short(want)}"
            )
    point = ev.get("falsifiable_point")
    if point is not None:
        want = c.preflight.falsifiable_point.model_dump(exclude={"statement"})
        for key, value in want.items():
            if not _same(point.get(key), value):
                problems.append(
                    f"falsifiable_point.{key} {_short(point.get(key))} is not the contract's {_short(value)}"
                )
        signals = [
            {"seed": r["seed"], **r["first_signal"]}
            for r in ev["runs"]
            if isinstance(r.get("first_signal"), dict)
        ]
        if not _same(point.get("runs", []), signals):
            problems.append("falsifiable_point.runs is not what the runs' first signals record")
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


def _check_derived(loaded: LoadedContract, ev: dict, again: verdict.Verdict) -> list[str]:
    """Everything the verdict engine derives from the per-seed values (each condition's values, n,
    estimate, interval and p-values; the reasons, what would settle it, the halts; the correction)
    equals what today's code derives from the recorded runs, floats within a relative 1e-9. Verdict
    and outcomes are `_rederive`'s. Gates 3 and 5 as measured (`predictions`) likewise, where recorded."""
    problems = []
    if ev["settings"]["correction"] != again.correction:
        problems.append(
            f"settings.correction {ev['settings']['correction']!r} is not today's {again.correction!r}"
        )
    derived = again.to_dict()
    if "predictions" in ev:
        derived["predictions"] = verdict.predictions(
            loaded.contract, ev["runs"], (ev.get("falsifiable_point") or {}).get("runs", [])
        )
    for key in OPTIONAL_DERIVED:  # recorded only when not empty: absent and empty are the same
        ev = {**ev, key: ev.get(key) or type(derived[key])()}
    for key in DERIVED_TOP_LEVEL + ("predictions",):
        if key in ev and key in derived and not _same(ev[key], derived[key]):
            problems.append(
                f"the recorded {key} are not what the runs give: {_diff(ev[key], derived[key])}"
            )
    recorded = {}
    for c in ev["conditions"]:
        label = f"{c['list_name']}[{c['index']}]"
        if label in recorded:
            problems.append(f"conditions list {label} twice")
        recorded[label] = c
    fresh = {f"{c.list_name}[{c.index}]": c.to_dict() for c in again.conditions}
    for label in recorded.keys() - fresh.keys():
        problems.append(f"conditions include {label}, which the contract's decision does not have")
    for label, want in fresh.items():
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
                    f"{label} `{want['description']}`: recorded {key} {_short(got[key])}, the recorded "
                    f"runs give {_short(value)}"
                )
    return problems


MAX_REPORT_BYTES = 16 * 1024 * 1024


def _check_report(folder: Path, ev: dict) -> list[str]:
    """verdict.md is exactly the rendering of evidence.json."""
    from gates.yamlsafe import read_capped

    path = folder / ledger.REPORT
    fix = f"`gates render {folder.name}` rewrites it from the evidence"
    try:
        text = read_capped(path, MAX_REPORT_BYTES).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as e:
        return [f"{path} cannot be read ({str(e).splitlines()[0]}); {fix}"]
    try:
        rendered = ledger.render_report(ev)
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        IndexError,
    ) as e:  # a shape the schema lets through
        return [
            f"{folder / ledger.EVIDENCE} cannot be rendered ({type(e).__name__}: {str(e)[:100]}); expected "
            f"evidence as `gates run` writes it"
        ]
    if text != rendered:
        return [
            f"{path} is not the rendering of its evidence.json (edited, or left by an interrupted write or an "
            f"older renderer); {fix}"
        ]
    return []


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


def _replay(loaded: LoadedContract, ev: dict) -> list[str]:
    """Re-run the contract into a throwaway store and compare with the evidence, on the CPU thread count
    its runs recorded (when they all recorded the same one)."""
    from gates.runner import run_contract
    from gates.study import cpu_threads, recorded_threads

    tol = loaded.contract.replay
    counts = {recorded_threads(r.get("environment")) for r in ev.get("runs", [])}
    with (
        tempfile.TemporaryDirectory(prefix="gates-replay-") as tmp,
        cpu_threads(counts.pop() if len(counts) == 1 else None),
    ):
        fresh = run_contract(
            loaded, f"sqlite:///{Path(tmp) / 'mlflow.db'}", Path(tmp) / "runs", fresh=True
        )
    problems = []
    if fresh["verdict"] != ev["verdict"]:
        problems.append(
            f"replay gives verdict {fresh['verdict']!r}, evidence says {ev['verdict']!r}"
        )
    recorded = {(r["arm"], r["seed"]): r for r in ev["runs"]}
    for run in fresh["runs"]:
        old = recorded.get((run["arm"], run["seed"]))
        if old is None:
            problems.append(f"replay ran {run['arm']}/seed {run['seed']}, which the evidence lacks")
            continue
        if run["status"] != old["status"]:
            problems.append(
                f"{run['arm']}/seed {run['seed']}: replay status {run['status']}, recorded {old['status']}"
            )
        for name, value in old["metrics"].items():
            if (
                name in loaded.study.machine_metrics
            ):  # speed and memory of whichever machine replays
                continue
            new = run["metrics"].get(name)
            if not audit.within_tolerance(new, value, tol.abs_tolerance, tol.rel_tolerance):
                problems.append(
                    f"{run['arm']}/seed {run['seed']}: {name} replays as {new}, recorded {value} "
                    f"(tolerance abs {tol.abs_tolerance:g}, rel {tol.rel_tolerance:g})"
                )
    return problems


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
    log=None,
) -> list[ClaimCheck]:
    """Check every claim in `runs_root` (or only the contracts named); contracts without evidence
    are reported as pending when found by scanning, and as lost when named explicitly.

    Then the claims history (runs/INDEX.jsonl, gates.history): a broken chain, evidence changed or gone
    without an entry that says so, loses the claims concerned; a withdrawn claim is not checked and
    is reported as withdrawn. Each claim is annotated with its supersedes chain, the rules its
    recorded contract predates and whether its code changed since its evidence (`strict_code`: a
    stale claim is lost). `audit_seconds`: re-run randomly chosen completed runs of the contracts not
    replayed in CI within about that many seconds (gates.audit; `audit_seed` fixes the choice, else
    it comes from the git commit; `audit_tolerance` (abs, rel) for contracts without a `replay`
    section, else `Replay()`'s); `log` receives the audit's plan and results line by line."""
    from gates import history

    runs_root, contracts_root = Path(runs_root), Path(contracts_root)
    contracts = find_contracts(contracts_root)
    index = history.latest(runs_root)
    checks = []
    if only:
        for path in only:
            loaded = load_contract(
                path
            )  # a contract named on the command line must load: else exit 2
            contracts[loaded.id] = path
            evidence = ledger.evidence_dir(runs_root, loaded.id) / ledger.EVIDENCE
            if history.is_withdrawn(index.get(loaded.id)):
                checks.append(_withdrawn(loaded.id, index[loaded.id], evidence))
            elif evidence.exists():
                checks.append(check_claim(evidence, contracts, replay=replay))
            else:
                checks.append(
                    ClaimCheck(loaded.id, "lost", problems=[f"evidence missing: {evidence}"])
                )
    else:
        with_evidence = set()
        for evidence in sorted(runs_root.glob(f"*/{ledger.EVIDENCE}")):
            contract_id = evidence.parent.name
            if history.is_withdrawn(index.get(contract_id)):
                checks.append(_withdrawn(contract_id, index[contract_id], evidence))
            else:
                checks.append(check_claim(evidence, contracts, replay=replay))
            with_evidence.add(contract_id)
        for contract_id in sorted((set(contracts) | set(index)) - with_evidence):
            if history.is_withdrawn(index.get(contract_id)):
                checks.append(_withdrawn(contract_id, index[contract_id], None))
            elif contract_id in contracts:
                checks.append(
                    ClaimCheck(contract_id, "pending", problems=["no evidence yet (not run)"])
                )
            else:  # indexed, neither evidence nor contract: history.check says what disappeared
                checks.append(ClaimCheck(contract_id, "lost"))
    _check_history(checks, runs_root, contracts, named=bool(only))
    _annotate(checks, runs_root, contracts_root, strict_code=strict_code)
    if audit_seconds:
        audit.audit(
            checks,
            runs_root,
            contracts,
            audit_seconds,
            seed=audit_seed,
            log=log,
            default_tolerance=audit_tolerance,
        )
    return checks


def _withdrawn(contract_id: str, entry: dict, evidence: Path | None) -> ClaimCheck:
    """A withdrawn claim: shown with its last verdict, not checked (it is no longer made)."""
    check = ClaimCheck(
        contract_id,
        "withdrawn",
        withdrawn=True,
        withdrawal=f"{entry.get('reason') or 'no reason given'} (withdrawn {entry.get('time')})",
    )
    ev = ledger.raw_evidence(evidence) if evidence is not None else None
    if ev is not None:
        check.verdict, check.created_at = ev.get("verdict"), ev.get("created_at")
    return check


def _check_history(
    checks: list[ClaimCheck], runs_root: Path, contracts: dict[str, Path], *, named: bool
) -> None:
    """Lose the claims whose history (runs/INDEX.jsonl) is broken or does not vouch for their evidence."""
    from gates import history

    problems = history.check(runs_root, contracts)
    by_id = {c.contract_id: c for c in checks}
    for contract_id, found in problems.items():
        check = by_id.get(contract_id)
        if check is None:
            if named:
                continue  # `gates verify CONTRACT...`: only the claims named
            check = ClaimCheck(contract_id, "lost")
            checks.append(check)
            by_id[contract_id] = check
        if check.status == "pending":
            check.problems = []
        check.status = "lost"
        check.problems += found


def _annotate(
    checks: list[ClaimCheck], runs_root: Path, contracts_root: Path, *, strict_code: bool
) -> None:
    """Supersedes chain, rules the recorded contract predates, and staleness (the code changed since
    the evidence; with `strict_code` a stale claim is lost)."""
    from gates import history, provenance
    from gates.registry import study_module

    loaded = {}
    for path in sorted(list(contracts_root.glob("*.yaml")) + list(contracts_root.glob("*.yml"))):
        contract = load_contract_cached(path)
        if contract is not None:
            loaded.setdefault(contract.id, contract)
    evidence = {
        c.contract_id: ledger.raw_evidence(
            ledger.evidence_dir(runs_root, c.contract_id) / ledger.EVIDENCE
        )
        for c in checks
    }
    history.link_supersession(
        checks,
        {cid: lc.contract.supersedes for cid, lc in loaded.items() if lc.contract.supersedes},
        evidence,
    )
    siblings.annotate(checks, evidence)
    attempts, today = history.attempts(runs_root), {}
    for check in checks:
        tried = attempts.get(check.contract_id, [])
        check.attempts, check.earlier = len(tried), [a.line() for a in tried[:-1]]
        cid = check.contract_id
        if cid in loaded:
            check.rule_flags = list(getattr(loaded[cid], "rule_flags", []) or [])
        ev = evidence.get(cid)
        if ev is None or not isinstance(ev.get("study"), str):
            continue
        found = provenance.staleness(ev, study_module(ev["study"]), today=today)
        check.stale, check.stale_files, check.stale_note = (
            found.stale,
            list(found.files),
            found.note,
        )
        if strict_code and found.stale and check.status in ("ok", "lost"):
            check.status = "lost"
            check.problems.append(
                f"stale (--strict-code): the code changed since its evidence: "
                f"{describe_stale(check.stale_files)}" + (f" ({found.note})" if found.note else "")
            )
