"""`gates verify`: does every claim in runs/ still hold its evidence?

For each `runs/<id>/evidence.json`: the contract still exists and hashes to what the evidence
recorded; the verdict re-derived from the recorded per-seed metrics by today's code equals the
recorded one; with replay, contracts marked `replay: {ci: true}` are re-run and must give the same
verdict and metrics within their tolerance.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gates import ledger, verdict
from gates.contract import LoadedContract, load_contract
from gates.errors import UserError


@dataclass
class ClaimCheck:
    contract_id: str
    status: str  # "ok" | "lost" | "pending"
    verdict: str | None = None
    created_at: str | None = None
    problems: list[str] = field(default_factory=list)
    replayed: bool = False
    hash_ok: bool | None = None  # the contract's sha256 against the recorded one; None: not compared

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
        return _lost(check, f"{evidence_path}: {e}; expected valid evidence: restore the committed file from git, "
                            f"or run the contract again")
    check.verdict, check.created_at = ev["verdict"], ev["created_at"]
    if ev["contract_id"] != contract_id:
        return _lost(check, f"{evidence_path} records contract {ev['contract_id']!r}, not {contract_id!r}")

    # the contract is the repository's file with this id: a path the evidence names is never trusted
    duplicates = getattr(contracts, "duplicates", {}).get(contract_id)
    if duplicates:
        return _lost(check, f"contracts {', '.join(map(str, duplicates))} all have id {contract_id!r}; expected "
                            f"exactly one contract per id (a new version needs a new id)")
    path = contracts.get(contract_id)
    if path is None or not Path(path).is_file():
        broken = [(p, why) for p, why in getattr(contracts, "unloadable", {}).items() if p.stem == contract_id]
        if broken:
            return _lost(check, f"contract no longer loads: {broken[0][1]}")
        return _lost(check, f"contract {contract_id!r} is missing (recorded at {ev.get('contract_path')}); no "
                            f"contract file in the contracts folder has this id")
    try:
        loaded = load_contract(path)
    except UserError as e:
        return _lost(check, f"contract no longer loads: {e.render().splitlines()[0]}")
    if loaded.id != contract_id:
        return _lost(check, f"{path} now has id {loaded.id!r}")
    check.hash_ok = loaded.sha256 == ev["contract_sha256"]
    if not check.hash_ok:
        named = ev.get("contract_path")
        elsewhere = (f"; the evidence names {named}, but the contract with id {contract_id!r} is {path}"
                     if named and not _same_file(named, path) else "")
        return _lost(check, f"{path} was edited after its evidence: sha256 {loaded.sha256[:16]} != recorded "
                            f"{ev['contract_sha256'][:16]} (a new version needs a new id){elsewhere}")

    check.problems += _check_runs(loaded, ev)
    check.problems += _check_settings(loaded, ev)
    check.problems += _rederive(loaded, ev)
    check.problems += _check_derived(loaded, ev)
    check.problems += _check_report(evidence_path.parent, ev)
    if loaded.contract.tuning is not None or ev.get("tuning"):
        from gates.tuning import check_evidence as check_tuning  # imports Optuna: only when it matters

        check.problems += check_tuning(loaded, ev)
    if replay and loaded.contract.replay and loaded.contract.replay.ci and not check.problems:
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


def _rederive(loaded: LoadedContract, ev: dict) -> list[str]:
    """The verdict and each condition's outcome, recomputed from the recorded per-seed metrics."""
    again = verdict.decide(loaded.contract.decision, ev["runs"], loaded.study.metrics)
    problems = []
    if again.verdict != ev["verdict"]:
        problems.append(f"recorded verdict {ev['verdict']!r} does not reproduce from its metrics: "
                        f"today's code says {again.verdict!r}")
    recorded = {(c["list_name"], c["index"]): c["outcome"] for c in ev["conditions"]}
    for c in again.conditions:
        was = recorded.get((c.list_name, c.index))
        if was != c.outcome:
            problems.append(f"{c.list_name}[{c.index}] `{c.description}`: recorded {was!r}, re-derived {c.outcome!r}")
    return problems


def _replay(loaded: LoadedContract, ev: dict) -> list[str]:
    """Re-run the contract into a throwaway store and compare with the evidence."""
    from gates.runner import run_contract

    tol = loaded.contract.replay
    with tempfile.TemporaryDirectory(prefix="gates-replay-") as tmp:
        fresh = run_contract(loaded, f"sqlite:///{Path(tmp) / 'mlflow.db'}", Path(tmp) / "runs", fresh=True)
    problems = []
    if fresh["verdict"] != ev["verdict"]:
        problems.append(f"replay gives verdict {fresh['verdict']!r}, evidence says {ev['verdict']!r}")
    recorded = {(r["arm"], r["seed"]): r for r in ev["runs"]}
    for run in fresh["runs"]:
        old = recorded.get((run["arm"], run["seed"]))
        if old is None:
            problems.append(f"replay ran {run['arm']}/seed {run['seed']}, which the evidence lacks")
            continue
        if run["status"] != old["status"]:
            problems.append(f"{run['arm']}/seed {run['seed']}: replay status {run['status']}, recorded {old['status']}")
        for name, value in old["metrics"].items():
            if name in loaded.study.machine_metrics:  # speed and memory of whichever machine replays
                continue
            new = run["metrics"].get(name)
            if not _close(new, value, tol.abs_tolerance, tol.rel_tolerance):
                problems.append(f"{run['arm']}/seed {run['seed']}: {name} replays as {new}, recorded {value} "
                                f"(tolerance abs {tol.abs_tolerance:g}, rel {tol.rel_tolerance:g})")
    return problems


def _close(a, b, abs_tol: float, rel_tol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b or (math.isnan(a) and math.isnan(b))
    return abs(a - b) <= abs_tol + rel_tol * abs(b)


def verify(runs_root: Path, contracts_root: Path, only: list[Path] | None = None, *,
           replay: bool = False) -> list[ClaimCheck]:
    """Check every claim in `runs_root` (or only the contracts named); contracts without evidence
    are reported as pending when found by scanning, and as lost when named explicitly."""
    contracts = find_contracts(contracts_root)
    checks = []
    if only:
        for path in only:
            loaded = load_contract(path)  # a contract named on the command line must load: else exit 2
            contracts[loaded.id] = path
            evidence = ledger.evidence_dir(runs_root, loaded.id) / ledger.EVIDENCE
            if evidence.exists():
                checks.append(check_claim(evidence, contracts, replay=replay))
            else:
                checks.append(ClaimCheck(loaded.id, "lost", problems=[f"evidence missing: {evidence}"]))
        return checks
    with_evidence = set()
    for evidence in sorted(runs_root.glob(f"*/{ledger.EVIDENCE}")):
        checks.append(check_claim(evidence, contracts, replay=replay))
        with_evidence.add(evidence.parent.name)
    for contract_id in sorted(set(contracts) - with_evidence):
        checks.append(ClaimCheck(contract_id, "pending", problems=["no evidence yet (not run)"]))
    return checks
