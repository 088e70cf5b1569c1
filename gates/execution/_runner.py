"""What a contract's run is made of: its parent MLflow run (preflight, reuse of finished runs, the
runs a killed driver left), one arm x seed run under the stop rules (`run_job`, which runs it as
gates/execution/_study_run.py does), then the verdict and evidence (`finish`). The plan driver
(gates/execution/_tasks.py, entered by gates/execution/_executor.py's `run_plan`) puts them together
in the plan's order (gates/execution/_plan.py).

Every arm x seed is one MLflow run nested under the contract's parent run. A finished run
(completed, or halted by a stop rule) of the same contract hash and code is never redone unless
`fresh`; a run that crashed or was killed is redone. Evidence is written once, atomically, at the end.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from gates.contract import LoadedContract
from gates.entities import RunRecord
from gates.errors import UserError, UserErrors
from gates.execution._preflight import PreflightReport, preflight
from gates.execution._study_run import _run_one, run_record
from gates.record import (
    EVIDENCE,
    RECORD,
    REPORT,
    WITHDRAWAL_TAGS,
    Evidence,
    Provenance,
    Recording,
    Reproduction,
    Tracker,
    atomic_write_text,
    attempt_field,
    attempt_verdicts,
    compare_reproduction,
    condition_intervals,
    current_provenance,
    derive,
    evidence_dir,
    family_for,
    finished_record,
    learning_curves,
    pilot_runs,
    plan_recording,
    plotted_metrics,
    raw_evidence,
    read_evidence,
    record_entry,
    render_report,
    run_facts,
    shared_runs,
    signature,
    supersede_claim_run,
    write_evidence,
)
from gates.study import Budget


# ---------------------------------------------------------------------------------- progress
class Progress(Protocol):
    def start(self, arm: str, seed: int, steps: int, skipped: RunRecord | None = None) -> None: ...
    def update(self, arm: str, seed: int, step: int, metrics: dict[str, float | None]) -> None: ...
    def end(self, record: RunRecord) -> None: ...


class SilentProgress:
    def start(self, arm, seed, steps, skipped=None):
        pass

    def update(self, arm, seed, step, metrics):
        pass

    def end(self, record):
        pass


# ---------------------------------------------------------------------------------- the run
def check_existing_evidence(loaded: LoadedContract, runs_root: Path) -> None:
    """Refuse (exit 2, before any training) a contract that is not the one its id was recorded under:
    by the evidence in place, or by the claims history (evidence replaced along with the contract)."""
    from gates.record import (
        contract_change,
        design_of,
        is_withdrawn,
        latest_entries,
        require_index_file,
        successor_problem,
    )

    try:  # the run will append to the claims history: a folder or FIFO there is refused now
        require_index_file(runs_root)
    except ValueError as e:
        raise UserError(str(e), field="--runs-dir") from None
    path = evidence_dir(runs_root, loaded.id) / EVIDENCE
    recorded = None
    # a withdrawn claim's evidence is replaced by the attempt that records it anew; unreadable
    # evidence by the new run
    if path.exists() and not is_withdrawn(latest_entries(runs_root).get(loaded.id)):
        with contextlib.suppress(ValueError):
            recorded = read_evidence(path).contract_sha256
    if recorded is not None and recorded != loaded.sha256:
        raise UserError(
            f"{path} was recorded for contract sha256 {recorded[:16]}, but this contract hashes "
            f"to {loaded.sha256[:16]}: it was edited after its evidence; expected an unchanged "
            f"contract, or a new version under a new id",
            file=str(loaded.path),
            line=1,
            field="id",
        )
    changed = contract_change(runs_root, loaded.id, loaded.sha256, loaded.contract.supersedes)
    if changed:  # the evidence was replaced along with the contract: the history still says
        raise UserError(changed, file=str(loaded.path), line=1, field="id")
    unlinked = successor_problem(
        runs_root,
        loaded.id,
        design_of(loaded.contract.model_dump(mode="json")),
        loaded.contract.supersedes,
    )
    if unlinked:  # withdrawn, then registered again under a new id: it names what it replaces
        raise UserError(unlinked, file=str(loaded.path), line=1, field="supersedes")


@dataclass
class ParentRun:
    """A contract's MLflow parent run, prepared for its arm x seed jobs by the driver of `gates run`
    (task processes rebuild it from what the driver ships: gates.execution._jobs.load_context)."""

    loaded: LoadedContract
    tracking_uri: str
    tracker: Tracker
    experiment_id: str
    parent_id: str
    base_tags: dict[str, str]
    prov: Provenance | None = None
    pre: PreflightReport | None = None
    tuning: dict | None = (
        None  # the tuning record (gates/execution/_tuning.py) when the contract tunes its arms
    )

    @property
    def budget(self) -> Budget:
        return Budget(self.loaded.contract.budget.steps, self.loaded.contract.budget.eval_every)

    def apply_tuning(self, storage_url: str | None, progress, *, fresh: bool = False) -> None:
        """The tuning (gates.execution._tuning.tune_and_apply: its trials run here, or are found done in
        `storage_url`) recorded under this parent run, and its best configs made the contract's."""
        from gates.execution._tuning import tune_and_apply

        self.loaded, self.tuning = tune_and_apply(
            self.loaded,
            self.tracking_uri,
            parent_run_id=self.parent_id,
            experiment_id=self.experiment_id,
            storage_url=storage_url,
            fresh=fresh,
            progress=progress,
            prov=self.prov,
        )


def prepare_parent(
    loaded: LoadedContract, tracking_uri: str, runs_root: Path, *, fresh: bool = False
) -> ParentRun:
    """Refuse a failed preflight, then open (or reuse) the parent MLflow run (an edited contract was
    refused before its recording was planned: `run_plan`, or `gates run`'s admission)."""
    pre = preflight(loaded)
    if pre.errors:
        raise UserErrors(pre.errors)

    prov = current_provenance(type(loaded.study).__module__)
    tracker = Tracker(tracking_uri)
    experiment_id, parent_id, base_tags = tracker.open_parent(loaded, prov, fresh)
    return ParentRun(loaded, tracking_uri, tracker, experiment_id, parent_id, base_tags, prov, pre)


def finished_runs(
    parent: ParentRun, *, kill_running: bool = True
) -> dict[tuple[str, int], RunRecord]:
    """(arm, seed) -> record of the finished (completed or halted) child runs under the parent, as MLflow
    holds them. A child left RUNNING by a kill is closed (KILLED) when `kill_running`; it will be redone."""
    done = {}
    for run in parent.tracker.child_runs(parent.experiment_id, parent.parent_id):
        record = finished_record(run)
        if record is not None:
            done[(record.arm, record.seed)] = record
        elif run.info.status == "RUNNING" and kill_running:
            parent.tracker.kill(run.info.run_id)
    return done


OWNER_TAG = "gates.local_owner"  # "host:pid" of the single-process `gates run` that created or reopened a run


def local_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def own_parent(parent: ParentRun) -> None:
    """This process drives the parent run: every run created for it carries this process's owner tag
    (the Ray executor's tasks too: they die with their driver), and the runs a killed driver on this
    machine left RUNNING are closed first."""
    owner = local_owner()
    parent.base_tags = {**parent.base_tags, OWNER_TAG: owner}
    parent.tracker.client.set_tag(parent.parent_id, OWNER_TAG, owner)
    close_abandoned(parent)


def close_abandoned(parent: ParentRun) -> list[str]:
    """Close (KILLED) the runs of this contract that a `gates run` on this machine left RUNNING when it was
    killed, under any parent run: after a code change the next run opens a new parent, and the old one's
    runs would stay RUNNING for good. Only runs whose owner process (the driver whose tag every run of
    it carries, a task's elsewhere too) is gone; runs without an owner (recorded by an older gates) are
    left to `finished_runs`. Called under the contract's lock."""
    host = socket.gethostname()
    found = parent.tracker.client.search_runs(
        [parent.experiment_id],
        filter_string=f"attributes.status = 'RUNNING' and tags.`{OWNER_TAG}` LIKE '{host}:%'",
        max_results=10000,
    )
    closed = []
    for run in found:
        owner_host, _, pid = run.data.tags.get(OWNER_TAG, "").rpartition(":")
        if (
            run.info.run_id == parent.parent_id
            or owner_host != host
            or not pid.isdigit()
            or _alive(int(pid))
        ):
            continue
        if run.data.tags.get("gates.role") == "contract":
            parent.tracker.client.set_terminated(run.info.run_id, status="KILLED")
        else:
            parent.tracker.kill(run.info.run_id)
        closed.append(run.info.run_id)
    return closed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def run_job(
    parent: ParentRun,
    arm: str,
    seed: int,
    progress: Progress | None = None,
    others: dict | None = None,
) -> tuple[RunRecord, dict]:
    """Train one arm x seed as a nested run of `parent`: (its record, its metric histories). `others`:
    arm -> metric -> [(step, value)] of the arms already run on this seed (for relative futility)."""
    return _run_one(
        parent.loaded,
        parent.tracker,
        parent.experiment_id,
        parent.parent_id,
        parent.base_tags,
        arm,
        parent.loaded.arm_configs[arm],
        seed,
        parent.budget,
        progress or SilentProgress(),
        others=dict(others or {}),
    )


@dataclass
class Reuse:
    """What a `gates run` trained and what it took from MLflow, said in one line after the run."""

    total: int = 0  # arm x seed records
    trained: int = 0
    reused: int = 0  # finished runs of the same contract hash and code
    skipped: int = 0  # not run: their arm failed on its last runs (stop_rules.failures)
    other_code: int = 0  # finished runs of this contract under other code: never reused
    other_code_sha256: str | None = None

    def line(self) -> str:
        text = f"reused {self.reused} of {self.total} runs, trained {self.trained}"
        if self.skipped:
            text += f", {self.skipped} not run (their arm kept failing)"
        if self.other_code:
            text += (
                f"; {self.other_code} runs recorded under other code ({self.other_code_sha256[:12]}) were not "
                f"reused: the code changed since"
            )
        return text

    def tally(self, records: list[RunRecord], reused: int) -> None:
        """The counts of a run whose `records` are all in, `reused` of them taken from MLflow."""
        self.total, self.reused = len(records), reused
        self.skipped = sum(r.status == "skipped" for r in records)
        self.trained = self.total - self.reused - self.skipped

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Outcome:
    """What `gates run` did: the evidence these runs give, whether it was recorded as a new attempt or
    compared with the recorded one (`reproduction`), and what was reused."""

    evidence: Evidence
    recording: Recording
    reuse: Reuse
    reproduction: Reproduction | None = None
    # why the MLflow parent run of the claim this one supersedes was not tagged (None: it was, or
    # nothing is superseded); the claims history records the supersession either way
    mlflow_note: str | None = None

    @property
    def recorded(self) -> bool:
        return self.recording.mode == RECORD


def runs_under_other_code(parent: ParentRun) -> tuple[int, str | None]:
    """(finished arm x seed runs of this contract hash recorded under another code fingerprint, the latest
    such fingerprint): runs a code change keeps `gates run` from reusing."""
    found = parent.tracker.client.search_runs(
        [parent.experiment_id],
        filter_string=(
            f"tags.`gates.role` = 'run' and tags.`gates.contract_sha256` = '{parent.loaded.sha256}' and "
            f"tags.`gates.code_sha256` != '{parent.prov.code_sha256}' and attributes.status = 'FINISHED'"
        ),
        order_by=["attributes.start_time DESC"],
        max_results=10000,
    )
    return len(found), (found[0].data.tags.get("gates.code_sha256") if found else None)


def skipped_record(arm: str, seed: int, failing: list[RunRecord]) -> RunRecord:
    """The record of an arm x seed not run because its arm failed on its last runs (no MLflow run)."""
    first = next((r for r in failing if r.error is not None), failing[0])
    error = first.error
    where = f"{error.where}: " if error is not None and error.where else ""
    what = (
        f"{error.type}: {error.message}"
        if error is not None and error.type
        else str(first.halt_detail)
    )
    detail = (
        f"not run: arm {arm} failed on its last {len(failing)} runs (seeds "
        f"{', '.join(str(r.seed) for r in failing)}); first error: {where}{what}"
    )
    return run_record(
        {
            "arm": arm,
            "seed": seed,
            "status": "skipped",
            "halt_reason": "failures",
            "halt_detail": detail[:2000],
            "metrics": {},
            "seconds": 0.0,
            "first_signal": None,
            "mlflow_run_id": None,
        }
    )


def finish(
    parent: ParentRun,
    records: list[RunRecord],
    runs_root: Path,
    recording: Recording | None = None,
    reuse: Reuse | None = None,
) -> Outcome:
    """The verdict from the records (one per arm x seed, in job order), then either a new attempt
    (evidence and report written atomically to runs/<id>/ and indexed) or, for a recorded claim, the
    comparison with its record (nothing written under runs/); and the parent run's outcome tags,
    metrics, plots and artifacts."""
    recording = recording or plan_recording(parent.loaded, runs_root)
    loaded, tracker = parent.loaded.replace(family=recording.family), parent.tracker
    c = loaded.contract
    facts = _run_facts(parent, records)
    after = {}
    shared = shared_runs(_recorded_evidence(runs_root, c.id, facts), only=c.id).get(c.id)
    if shared:  # runs other recorded contracts ran too: one observation, said beside this verdict
        after["shared_runs"] = shared
    if recording.mode == RECORD:
        after["attempt"] = attempt_field(recording)
    else:  # reproduced: the recorded attempt's field, as recorded
        attempt = recording.recorded.attempt if recording.recorded is not None else None
        after["attempt"] = attempt.as_dict() if attempt is not None else None
    derived = derive(loaded, facts, tuning=parent.tuning, after=after)
    result, evidence = derived.verdict, derived.evidence
    reproduction = None
    with tempfile.TemporaryDirectory(prefix="gates-plots-") as tmp:
        if recording.mode == RECORD:
            path = write_evidence(runs_root, evidence)
            # the claims index vouches for these exact bytes; a kill before this line leaves evidence that
            # `gates verify` reports as unindexed, and running the contract again writes and indexes it anew
            record_entry(runs_root, path, "recorded", recording.reason)
        else:  # a recorded claim, reproduced: compared with its record, written only to the MLflow parent run
            reproduction = compare_reproduction(
                recording.recorded, evidence, recording.number, loaded.study.machine_metrics
            )
            path = Path(tmp) / "reproduced" / EVIDENCE
            path.parent.mkdir()
            atomic_write_text(
                path, json.dumps(evidence.as_dict(), indent=2, allow_nan=False) + "\n"
            )
            atomic_write_text(path.parent / REPORT, render_report(evidence))
        outcome_tags = {
            f"gates.condition.{r.list_name}.{r.index}": r.outcome
            for r in result.conditions + result.controls
        }
        outcome_metrics = {
            f"condition.{r.list_name}.{r.index}.{k}": getattr(r, k)
            for r in result.conditions
            for k in ("estimate", "p_hold_adj", "p_fail_adj")
            if isinstance(getattr(r, k), (int, float)) and math.isfinite(getattr(r, k))
        }
        histories = {
            (r.arm, r.seed): {m: tracker.history(r.mlflow_run_id, m) for m in plotted_metrics(c)}
            for r in records
            if r.mlflow_run_id
        }
        figures = [  # (the plots read the runs as evidence.json lists them)
            learning_curves(c, histories, evidence.runs, Path(tmp) / "learning_curves.png"),
            condition_intervals(c.id, evidence.conditions, Path(tmp) / "conditions.png"),
        ]
        tags = {
            **outcome_tags,
            "gates.verdict": result.verdict,
            "gates.signature": signature(evidence),
            "gates.mode": recording.mode,
            "gates.attempt": str(recording.number),
        }
        if reproduction is not None:
            tags["gates.reproduces"] = "true" if reproduction.reproduces else "false"
        tracker.finish_parent(
            parent.parent_id,
            tags,
            outcome_metrics,
            [str(path), str(path.parent / REPORT), *map(str, figures)],
            clear=WITHDRAWAL_TAGS if recording.mode == RECORD else (),
        )
    note = None
    # a new claim recorded: the parent run of the claim it supersedes says what replaced it (a new
    # contract under a withdrawn id supersedes its own id: that evidence is this one now, and the old
    # attempt's run already says withdrawn)
    if recording.mode == RECORD and c.supersedes not in (None, c.id):
        note = supersede_claim_run(
            evidence_dir(runs_root, c.supersedes) / EVIDENCE, c.id, parent.tracking_uri
        )
    return Outcome(evidence, recording, reuse or Reuse(total=len(records)), reproduction, note)


def _recorded_evidence(runs_root: Path, contract_id: str, evidence: dict) -> dict[str, dict | None]:
    """Every other claim's evidence in runs_root (plain JSON), and this one's as recorded now (its runs
    and settings: what `shared_runs` compares)."""

    found = {p.parent.name: raw_evidence(p) for p in sorted(Path(runs_root).glob(f"*/{EVIDENCE}"))}
    return {**found, contract_id: evidence}


def rederive(
    loaded: LoadedContract, runs_root: Path, reason: str
) -> tuple[Evidence, Evidence] | None:
    """Re-derive a recorded claim's verdict with today's engine from its recorded per-seed values (no
    training): rewrite evidence.json and verdict.md and index the change with `reason`. Returns (old,
    new) evidence when anything changed, None when today's engine derives the same record.

    Refused unless the claims history vouches for the evidence as it is (its bytes are those of the
    latest entry, so per-seed values edited since cannot be laundered into a new entry); None when
    today's engine, rules and claim family derive the record as stored (nothing to correct). The entry
    records what the evidence was derived under (`rederived_from`). Like recording, refused from a
    contract or code (the verdict engine in gates/ included) that no commit holds as it is."""
    from gates.record import INDEX, latest_entries, record_entry, refuse_uncommitted, sha256_file
    from gates.study import study_module

    refuse_uncommitted(loaded.path, study_module(loaded.contract.study), "re-derive")
    path = evidence_dir(runs_root, loaded.id) / EVIDENCE
    try:
        old = read_evidence(path)
    except ValueError as e:
        raise UserError(f"cannot re-derive from {path}: {e}", file=str(loaded.path)) from None
    if old.contract_sha256 != loaded.sha256:
        raise UserError(
            f"{path} was recorded for another version of this contract (sha256 "
            f"{old.contract_sha256[:16]} != {loaded.sha256[:16]}); re-deriving needs the contract "
            f"it was recorded under",
            file=str(loaded.path),
        )
    entry = latest_entries(runs_root).get(loaded.id)
    if entry is None or entry.kind == "withdrawn":
        raise UserError(
            f"{loaded.id} has no standing entry in {runs_root / INDEX}; only an indexed, "
            f"standing claim is re-derived",
            file=str(loaded.path),
        )
    if sha256_file(path) != entry.evidence_sha256:
        raise UserError(
            f"{path} is not the evidence {INDEX} line {entry.line} vouches for (its bytes "
            f"changed since): re-deriving starts only from evidence as it was indexed",
            file=str(loaded.path),
        )
    # the family as the record stands (its contract's folder), judging the attempt this evidence is
    loaded = loaded.replace(family=family_for(loaded, runs_root, attempt_verdicts(old)[:-1]))
    family = old.family.as_dict() if old.family is not None else None
    tuning = old.tuning.as_dict() if old.tuning is not None else None
    derived = derive(loaded, old, tuning=tuning)
    if derived.data == old.as_dict():  # compared with the record as stored
        return None
    new = derived.evidence
    written = write_evidence(runs_root, new)
    before = {"engine_version": str(old.engine_version), "rule_flags": list(old.rule_flags)}
    if family is not None or new.family is not None:
        before["family"] = family
    record_entry(runs_root, written, "rederived", reason, extra={"rederived_from": before})
    return old, new


def _run_facts(parent: ParentRun, records: list[RunRecord]) -> dict:
    """This run's record before its verdict (gates.record.run_facts), with what the derivation may not
    read itself: the time, the contract's path from here, the pilots in the MLflow store."""
    loaded = parent.loaded
    try:
        contract_path = str(loaded.path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        contract_path = str(loaded.path)
    pilots = pilot_runs(parent.tracking_uri, loaded.contract.id, loaded.path)
    return run_facts(
        loaded,
        parent.prov,
        records,
        preflight=parent.pre.as_dict(),
        mlflow={
            "tracking_uri": parent.tracking_uri,
            "experiment_id": parent.experiment_id,
            "parent_run_id": parent.parent_id,
        },
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        contract_path=contract_path,
        pilots=[p.as_dict() for p in pilots],
    )
