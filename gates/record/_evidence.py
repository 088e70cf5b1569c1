"""The evidence ledger: `runs/<id>/evidence.json` and its human-readable `verdict.md`.

Files are written atomically (temporary file in the same folder, fsync, rename), so a crash or a
kill leaves either the old evidence or the new one, never a half-written file. evidence.json is the
record and is written first; verdict.md is derived from it (`render_report`) and written second, so
a kill between the two leaves new evidence beside an old verdict.md, which `gates verify` detects
and `gates render` (or the next `gates run`) repairs. Evidence is read as records (`Evidence`, frozen
pydantic models) that check the shapes every reader relies on, after bringing an older format up to
the current one (`EVIDENCE_FORMAT`, `_migrate`); `raw_evidence` reads the plain JSON.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

import gates
from gates.contract import read_capped
from gates.entities import (
    BeyondCeilingRecord,
    ConditionRecord,
    FirstSignalRecord,
    HaltRecord,
    LookRecord,
    LostValueRecord,
    NotRunRecord,
    Number,
    Real,
    Record,
    RunRecord,
    TuningRecord,
)
from gates.errors import storage_error
from gates.record._files import (
    MAX_EVIDENCE_BYTES,
    fsync_dir,
    parse_json,
    read_json_object,
)

EVIDENCE = "evidence.json"
REPORT = "verdict.md"
EVIDENCE_FORMAT = 1


@contextlib.contextmanager
def atomic_writer(path: Path):
    """Yield a text file; on a clean exit it replaces `path` in one rename, else it is discarded.
    The file gets ordinary permissions (0666 less the umask: 0644 under umask 022), as `open` would
    give; mkstemp's 0600 would hide committed evidence from the other users of a shared checkout.
    A full disk or an unwritable folder is a StorageError naming `path` (the old file is kept, the
    temporary file removed)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            tmp = str(path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp")
            try:
                fd = os.open(
                    tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666
                )
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free temporary name for {path}")
    except OSError as e:
        _unwritable(e, path)
        raise
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as e:
        # OSError: a folder gone read-only keeps it, and the error that matters is `e`
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _unwritable(e, path)
        raise


def _unwritable(e: BaseException, path: Path) -> None:
    """Raise a StorageError naming `path` (not the temporary file) when `e`, an OSError, is a full
    disk or an unwritable folder; else nothing (the caller re-raises `e`)."""
    found = storage_error(e, path) if isinstance(e, OSError) else None
    if found is not None:
        raise found from e


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_writer(path) as f:
        f.write(text)


def signature(evidence: Evidence | dict) -> str:
    """A sacrebleu-style signature: everything needed to know how the verdict was computed."""
    ev = as_evidence(evidence)
    s = ev.settings
    tests = ",".join(sorted({c.test for c in ev.conditions}))
    parts = [
        f"contract:{ev.contract_id}",
        f"sha256:{ev.contract_sha256[:16]}",
        f"commit:{ev.git_commit[:12]}{'+dirty' if ev.git_dirty == 'true' else ''}",
        f"code:{ev.code_sha256[:12]}",
        f"eval:{s.evaluation}",
        f"test:{tests}",
        f"correction:{s.correction}",
        f"alpha:{s.alpha}",
        # a later version of a claim is judged at what its family left (gates.record._family)
        *([f"family:{ev.family.root}@{ev.family.level:g}"] if ev.family is not None else []),
        f"engine:{ev.engine_version}",
        f"seeds:{','.join(str(x) for x in s.seeds)}",
        f"gates:{ev.gates_version if ev.has('gates_version') else gates.__version__}",
    ]
    if ev.looks:  # a sequential design: the seeds judged at the look that stopped it
        parts.insert(-1, f"looks:{len(ev.looks)}@{len(ev.looks[-1].seeds)}seeds")
    devices = devices_of(ev)
    if (
        devices
    ):  # where the runs were computed (evidence from before devices were recorded has none)
        parts.insert(-1, f"device:{'+'.join(devices)}")
    return "|".join(parts)


def devices_of(evidence: Evidence | dict) -> list[str]:
    """The devices the runs were computed on, e.g. ["cpu"] or ["cuda:NVIDIA H200"], sorted."""
    found = set()
    for run in as_evidence(evidence).runs:
        env = run.environment or {}  # a str -> str mapping, as recorded
        if env.get("device"):
            found.add(f"{env['device']}:{env['gpu']}" if env.get("gpu") else env["device"])
    return sorted(found)


def evidence_dir(runs_root: Path, contract_id: str) -> Path:
    return runs_root / contract_id


def clean_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files a killed write left in a runs/<id>/ folder (`.evidence.json.*.tmp`,
    `.verdict.md.*.tmp`); the files removed."""
    removed = []
    for name in (EVIDENCE, REPORT):
        for stray in folder.glob(f".{name}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                stray.unlink()
                removed.append(stray)
    return removed


# ---------------------------------------------------------------------------------- the schema
# Evidence and the records only it holds; the record base, the run and condition records and the
# verdict's parts (halts, lost values, arms not run, bars beyond the ceiling, looks), which the verdict
# engine builds too, are entities (gates.entities): one schema for each.
class BudgetRecord(Record):
    steps: int
    eval_every: int


class SettingsRecord(Record):
    alpha: Real
    evaluation: str
    correction: str
    seeds: list[int]
    budget: BudgetRecord
    arm_configs: dict[str, dict]


class SignalRecord(FirstSignalRecord):
    seed: int


class FalsifiablePointRecord(Record):
    metric: str
    arm: str
    direction: str
    threshold: Real
    by_step: int
    runs: list[SignalRecord] = []


class PreflightArmRecord(Record):
    params: Real
    params_ratio: Real
    flops_ratio: Number = None


class PreflightRecord(Record):
    arms: dict[str, PreflightArmRecord] = {}
    notes: list[str] = []


class MlflowRecord(Record):
    tracking_uri: str | None = None
    experiment_id: str | None = None
    parent_run_id: str | None = None


class PredictedAblationRecord(Record):
    arm: str
    metric: str
    versus: str
    direction: str
    predicted_size: Number = None
    measured_size: Number = None
    came_true: bool | None = None
    sd: Number = None
    seeds_for_80pct_power: int | None = None


class PredictedPointRecord(Record):
    met_on: int
    of: int
    came_true: bool | None = None


class PredictionsRecord(Record):
    predicted_ablation: PredictedAblationRecord | None = None
    falsifiable_point: PredictedPointRecord | None = None


class EarlierAttemptRecord(Record):
    number: int
    verdict: str | None = None
    recorded: str | None = None
    reason: str = ""
    withdrawn: str | None = None
    why: list[str] = []


class AttemptRecord(Record):
    """Which attempt at the claim this evidence is, why it was recorded, and the attempts before it."""

    number: int
    reason: str = ""
    earlier: list[EarlierAttemptRecord] = []


class FamilyVersionRecord(Record):
    contract_id: str
    level: Real


class FamilyRecord(Record):
    """The claim family a version belongs to (gates.record._family): its first version, the family's
    alpha, the recorded versions before it with the alpha each spent, and the alpha it was tested at."""

    root: str
    alpha: Real
    earlier: list[FamilyVersionRecord] = []
    level: Real
    attempt: int = 1  # which attempt of its version (written when later than the first)
    attempts_spent: Real = 0  # what the version's earlier attempts spent (written with `attempt`)


class PilotRecord(Record):
    """A pilot run of the contract (`gates pilot`, on a seed no contract uses): what the author could see
    before registering. `before_registration`: whether it started before the contract file's first
    commit (None outside git, or for a contract not committed yet)."""

    arm: str
    seed: int
    steps: int
    status: str
    metrics: dict[str, Real] = {}
    started: str
    contract_sha256: str
    git_commit: str
    mlflow_run_id: str
    before_registration: bool | None = None


class DesignRecord(Record):
    factor: list[str] = []
    differences: dict[str, str] = {}
    blind: dict[str, str] = {}
    no_convergence: str | None = None


class Evidence(Record):
    """runs/<id>/evidence.json: what a run of a contract recorded and the verdict derived from it.
    Read with `read_evidence` (checked, brought up to the current format), built by the runner with
    `Evidence.of`; `as_dict()` is the JSON that evidence.json holds."""

    format: int = EVIDENCE_FORMAT
    contract_id: str
    contract_path: str | None = None
    contract_sha256: str
    claim: str | None = None
    source: str | None = None
    study: str | None = None
    verdict: Literal["supported", "refuted", "inconclusive", "invalid"]
    reasons: list[str] = []
    settle: list[str] = []
    git_commit: str
    git_dirty: str
    code_sha256: str
    code_files: dict[str, str] | None = None  # per-file hashes (absent in older evidence)
    gates_version: str | None = None
    engine_version: str | None = "1"  # absent: recorded before engines were numbered (engine 1)
    created_at: str
    settings: SettingsRecord
    mlflow: MlflowRecord | None = None
    preflight: PreflightRecord | None = None
    falsifiable_point: FalsifiablePointRecord | None = None
    runs: list[RunRecord]
    conditions: list[ConditionRecord]
    halts: list[HaltRecord] = []
    tuning: TuningRecord | None = None
    lost: list[LostValueRecord] = []
    controls: list[ConditionRecord] = []
    looks: list[LookRecord] = []
    predictions: PredictionsRecord | None = None
    rule_flags: list[str] = []
    supersedes: str | None = None
    attempt: AttemptRecord | None = None  # absent in evidence from before attempts were recorded
    design: DesignRecord | None = None
    regime: dict | None = None
    study_package: str | None = None
    not_run: list[NotRunRecord] = []
    beyond_ceiling: list[BeyondCeilingRecord] = []
    tuning_edges: dict[str, str] = {}
    shared_runs: dict[str, list[str]] = {}
    family: FamilyRecord | None = None  # absent: a first version, or recorded before families
    pilots: list[PilotRecord] = []  # absent: none run, or recorded before pilots were listed

    @classmethod
    def of(cls, data: dict) -> Evidence:
        """Evidence from its data as the runner builds it (any JSON-serialisable values): checked as
        `read_evidence` checks a file, after the JSON round trip evidence.json makes (tuples become
        lists, keys strings); ValueError saying what is wrong."""
        try:
            data = json.loads(json.dumps(data, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise ValueError(f"evidence is not JSON data: {_one_line(e)}") from None
        return _checked(data)


def as_evidence(evidence: Evidence | dict) -> Evidence:
    """An Evidence as it is, or JSON data of one checked into one (ValueError when malformed)."""
    return evidence if isinstance(evidence, Evidence) else Evidence.of(evidence)


REQUIRED = tuple(name for name, f in Evidence.model_fields.items() if f.is_required())


# ---------------------------------------------------------------------------------- formats
# evidence.json's `format` says how to read it; EVIDENCE_FORMAT is the one written today. A reader brings an
# older format up to EVIDENCE_FORMAT on read (`_migrate`, one step per format) and refuses a newer one, which
# it could misread. Fields added within a format (evidence of older writers lacks them) are read with
# the record's defaults; within format 1 that is every field added since the first commit:
# `first_signal`, `falsifiable_point`, `lost`, `predictions`, `rule_flags`, `controls`, `attempt`,
# `code_files`, `design`, `regime`, `study_package`, `shared_runs`, a run's `environment`,
# `converged`, `convergence` and `error`, the verdict engine 3's `not_run`, `beyond_ceiling` and
# `tuning_edges` (absent: none), `family` and `pilots` (absent: none), and `engine_version`
# (absent: "1", before engines were numbered).
#
# Formats:
#   0  no `format` key (or null): never written by gates (every writer wrote 1), read as format 1
#      with the key set, first;
#   1  the current format.
def _from_0(data: dict) -> dict:
    return {"format": 1, **{k: v for k, v in data.items() if k != "format"}}


_UPGRADES = {0: _from_0}  # format N -> its data in format N + 1


def _migrate(data: dict) -> dict:
    """Evidence data of any known format brought up to EVIDENCE_FORMAT (the data itself when it is in
    EVIDENCE_FORMAT already); ValueError for a newer or unknown format. A `format` that is no integer is left
    for the schema to name."""
    version = data.get("format")
    if version is None:
        version = 0
    if not isinstance(version, int) or isinstance(version, bool):
        return data
    if version > EVIDENCE_FORMAT:
        raise ValueError(
            f"evidence has format {version}, newer than this gates reads ({EVIDENCE_FORMAT}); expected format "
            f"{EVIDENCE_FORMAT} or older: upgrade gates (gates {gates.__version__})"
        )
    if version < 0:
        raise ValueError(
            f"evidence has an unknown format {version}; expected 0 to {EVIDENCE_FORMAT}"
        )
    while version < EVIDENCE_FORMAT:
        data, version = _UPGRADES[version](data), version + 1
    return data


def raw_evidence(path: Path) -> dict | None:
    """The evidence as plain JSON, or None; never blocks on a FIFO or reads past the evidence cap."""
    return read_json_object(path, MAX_EVIDENCE_BYTES)


def read_evidence(path: Path) -> Evidence:
    """Parse and check an evidence file, brought up to the current format: its Evidence (extra keys
    kept), or ValueError saying in one line what is wrong (unreadable, not JSON, a newer format, or the
    wrong shape, naming the first bad fields)."""
    try:
        raw = read_capped(Path(path), MAX_EVIDENCE_BYTES)
    except ValueError as e:
        raise ValueError(f"unreadable evidence: {_one_line(e)}") from None
    return parse_evidence(raw)


@functools.lru_cache(maxsize=128)
def parse_evidence(raw: bytes) -> Evidence:
    """`read_evidence` of an evidence file's bytes, read already (by a caller that hashes them too).
    Parsed and checked once per content: a command that reads a claim's evidence in several places
    (admission, the recording's plan, the run's checks, the family) re-reads the bytes, which may have
    changed, but builds the records once; they are frozen, so every reader can share them."""
    try:
        data = parse_json(raw)
    except ValueError as e:
        raise ValueError(f"unreadable evidence: {_one_line(e)}") from None
    return _checked(data)


def _checked(data) -> Evidence:
    if not isinstance(data, dict):
        raise ValueError("evidence is not a JSON object")
    data = _migrate(data)
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"evidence lacks {', '.join(missing)}")
    if data["verdict"] not in ("supported", "refuted", "inconclusive", "invalid"):
        raise ValueError(f"evidence has an unknown verdict {data['verdict']!r}")
    try:
        return Evidence.model_validate(data)
    except ValidationError as e:
        raise ValueError(f"malformed evidence: {_shape_errors(e)}") from None


def _shape_errors(e: ValidationError, shown: int = 3) -> str:
    parts = []
    for x in e.errors()[:shown]:
        where = ".".join(str(p) for p in x["loc"]) or "(top level)"
        got = x.get("input")
        got = type(got).__name__ if isinstance(got, (dict, list)) else repr(got)[:60]
        parts.append(f"{where}: {x['msg'][0].lower() + x['msg'][1:]}, got {got}")
    more = e.error_count() - shown
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _one_line(what) -> str:
    return "; ".join(part.strip() for part in str(what).splitlines() if part.strip())
