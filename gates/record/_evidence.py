"""The evidence ledger: `runs/<id>/evidence.json` and its human-readable `verdict.md`.

Files are written atomically (temporary file in the same folder, fsync, rename), so a crash or a
kill leaves either the old evidence or the new one, never a half-written file. evidence.json is the
record and is written first; verdict.md is derived from it (`render_report`) and written second, so
a kill between the two leaves new evidence beside an old verdict.md, which `gates verify` detects
and `gates render` (or the next `gates run`) repairs. Evidence is read through a schema (`Evidence`)
that checks the shapes every reader relies on.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

import gates
from gates.contract import read_capped
from gates.record._files import fsync_dir

EVIDENCE = "evidence.json"
REPORT = "verdict.md"
FORMAT = 1


@contextlib.contextmanager
def atomic_writer(path: Path):
    """Yield a text file; on a clean exit it replaces `path` in one rename, else it is discarded.
    The file gets ordinary permissions (0666 less the umask: 0644 under umask 022), as `open` would
    give; mkstemp's 0600 would hide committed evidence from the other users of a shared checkout."""
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
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_writer(path) as f:
        f.write(text)


def signature(evidence: dict) -> str:
    """A sacrebleu-style signature: everything needed to know how the verdict was computed."""
    s = evidence["settings"]
    tests = ",".join(sorted({c["test"] for c in evidence["conditions"]}))
    parts = [
        f"contract:{evidence['contract_id']}",
        f"sha256:{evidence['contract_sha256'][:16]}",
        f"commit:{evidence['git_commit'][:12]}{'+dirty' if evidence['git_dirty'] == 'true' else ''}",
        f"code:{evidence['code_sha256'][:12]}",
        f"eval:{s['evaluation']}",
        f"test:{tests}",
        f"correction:{s['correction']}",
        f"alpha:{s['alpha']}",
        f"engine:{evidence.get('engine_version', '1')}",
        f"seeds:{','.join(str(x) for x in s['seeds'])}",
        f"gates:{evidence.get('gates_version', gates.__version__)}",
    ]
    looks = evidence.get("looks")
    if looks:  # a sequential design: the seeds judged at the look that stopped it
        parts.insert(-1, f"looks:{len(looks)}@{len(looks[-1]['seeds'])}seeds")
    devices = devices_of(evidence)
    if (
        devices
    ):  # where the runs were computed (evidence from before devices were recorded has none)
        parts.insert(-1, f"device:{'+'.join(devices)}")
    return "|".join(parts)


def devices_of(evidence: dict) -> list[str]:
    """The devices the runs were computed on, e.g. ["cpu"] or ["cuda:NVIDIA H200"], sorted."""
    found = set()
    for run in evidence.get("runs", []):
        env = run.get("environment") or {}
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
# The shapes that `gates verify`, `gates status`, `render_report`, the dashboard and `gates report`
# rely on. Extra keys are allowed everywhere (the verdict engine adds fields: a condition's
# `test_reason`, the evidence's `lost_runs`, `predictions`, ...); types are strict (a metric is a
# JSON number or null, never "0.9" or true; a seed is an integer, never 1.0).
class _Shape(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


Number = float | None  # a JSON number (an int is fine); null for a value that was not finite


class FirstSignalShape(_Shape):
    step: int | None = None
    value: Number = None
    met: bool


class ConvergenceShape(_Shape):
    """The trend a completed run was judged on under the contract's convergence rule."""

    metric: str
    window: int
    first_step: int | None = None
    last_step: int | None = None
    first_value: Number = None
    last_value: Number = None
    rel_improvement: Number = None


class RunErrorShape(_Shape):
    """What a failed run raised or returned: its type, message and where (the innermost frame, file:line)."""

    type: str
    message: str = ""
    where: str | None = None


class RunShape(_Shape):
    arm: str
    seed: int
    status: str
    halt_reason: str | None = None
    halt_detail: str | None = None
    metrics: dict[str, Number]
    seconds: Number = None
    first_signal: FirstSignalShape | None = None
    mlflow_run_id: str | None = None
    converged: bool | None = None  # only on completed runs of a contract with a convergence rule
    convergence: ConvergenceShape | None = None
    environment: dict[str, str] | None = (
        None  # device, torch, cuda, gpu, threads (studies with a device)
    )
    error: RunErrorShape | None = None  # a failed run's error


class ConditionShape(_Shape):
    list_name: Literal["supported_if", "refuted_if", "controls"]
    index: int
    kind: str | None = None
    description: str
    estimate: Number = None
    ci_low: Number = None
    ci_high: Number = None
    ci_level: Number = None
    p_hold: Number = None
    p_fail: Number = None
    p_hold_adj: Number = None
    p_fail_adj: Number = None
    test: str
    n: dict[str, int] = {}
    values: dict[str, list[Number]] = {}
    outcome: Literal["holds", "fails", "undetermined"]
    note: str | None = None
    seeds_needed: int | None = None
    test_reason: str | None = None


class BudgetShape(_Shape):
    steps: int
    eval_every: int


class SettingsShape(_Shape):
    alpha: float
    evaluation: str
    correction: str
    seeds: list[int]
    budget: BudgetShape
    arm_configs: dict[str, dict]


class SignalShape(FirstSignalShape):
    seed: int


class FalsifiablePointShape(_Shape):
    metric: str
    arm: str
    direction: str
    threshold: float
    by_step: int
    runs: list[SignalShape] = []


class PreflightArmShape(_Shape):
    params: float
    params_ratio: float
    flops_ratio: Number = None


class PreflightShape(_Shape):
    arms: dict[str, PreflightArmShape] = {}
    notes: list[str] = []


class MlflowShape(_Shape):
    tracking_uri: str | None = None
    experiment_id: str | None = None
    parent_run_id: str | None = None


class TrialShape(_Shape):
    number: int
    params: dict
    state: str
    value: Number = None


class BestTrialShape(_Shape):
    number: int
    params: dict


class TunedArmShape(_Shape):
    trials: list[TrialShape]
    best: BestTrialShape | None = None


class TuningShape(_Shape):
    arms: dict[str, TunedArmShape] = {}


class LostValueShape(_Shape):
    arm: str
    metric: str
    seed: int
    why: str


class PredictedAblationShape(_Shape):
    arm: str
    metric: str
    versus: str
    direction: str
    predicted_size: Number = None
    measured_size: Number = None
    came_true: bool | None = None
    sd: Number = None
    seeds_for_80pct_power: int | None = None


class PredictedPointShape(_Shape):
    met_on: int
    of: int
    came_true: bool | None = None


class PredictionsShape(_Shape):
    predicted_ablation: PredictedAblationShape | None = None
    falsifiable_point: PredictedPointShape | None = None


class EarlierAttemptShape(_Shape):
    number: int
    verdict: str | None = None
    recorded: str | None = None
    reason: str = ""
    withdrawn: str | None = None
    why: list[str] = []


class AttemptShape(_Shape):
    """Which attempt at the claim this evidence is, why it was recorded, and the attempts before it."""

    number: int
    reason: str = ""
    earlier: list[EarlierAttemptShape] = []


class DesignShape(_Shape):
    factor: list[str] = []
    differences: dict[str, str] = {}
    blind: dict[str, str] = {}
    no_convergence: str | None = None


class NotRunShape(_Shape):
    arm: str
    runs: int
    completed: int
    statuses: dict[str, int] = {}
    first_error: str | None = None
    text: str
    settle: str = ""


class BeyondCeilingShape(_Shape):
    condition: str
    description: str = ""
    ceiling: float
    min: float
    max: float
    source: str = ""
    why: str = ""
    text: str
    settle: str = ""


class Evidence(_Shape):
    """runs/<id>/evidence.json, as far as its readers rely on it."""

    format: int | None = None
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
    gates_version: str | None = None
    created_at: str
    settings: SettingsShape
    mlflow: MlflowShape | None = None
    preflight: PreflightShape | None = None
    falsifiable_point: FalsifiablePointShape | None = None
    runs: list[RunShape]
    conditions: list[ConditionShape]
    halts: list[dict] = []
    tuning: TuningShape | None = None
    lost: list[LostValueShape] = []
    controls: list[ConditionShape] = []
    looks: list[dict] = []
    predictions: PredictionsShape | None = None
    rule_flags: list[str] = []
    supersedes: str | None = None
    attempt: AttemptShape | None = None  # absent in evidence from before attempts were recorded
    design: DesignShape | None = None
    regime: dict | None = None
    study_package: str | None = None
    not_run: list[NotRunShape] = []
    beyond_ceiling: list[BeyondCeilingShape] = []
    tuning_edges: dict[str, str] = {}
    shared_runs: dict[str, list[str]] = {}


REQUIRED = tuple(name for name, f in Evidence.model_fields.items() if f.is_required())
MAX_EVIDENCE_BYTES = 64 * 1024 * 1024


def raw_evidence(path: Path) -> dict | None:
    """The evidence as plain JSON, or None; never blocks on a FIFO or reads past the evidence cap."""
    try:
        data = json.loads(read_capped(path, MAX_EVIDENCE_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_evidence(path: Path) -> dict:
    """Parse and check an evidence file: its data (a dict, extra keys kept), or ValueError saying in
    one line what is wrong (unreadable, not JSON, or the wrong shape, naming the first bad fields)."""
    from gates.contract import read_capped

    try:
        data = json.loads(read_capped(Path(path), MAX_EVIDENCE_BYTES).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"unreadable evidence: {_one_line(e)}") from None
    if not isinstance(data, dict):
        raise ValueError("evidence is not a JSON object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise ValueError(f"evidence lacks {', '.join(missing)}")
    if data["verdict"] not in ("supported", "refuted", "inconclusive", "invalid"):
        raise ValueError(f"evidence has an unknown verdict {data['verdict']!r}")
    try:
        Evidence.model_validate(data)
    except ValidationError as e:
        raise ValueError(f"malformed evidence: {_shape_errors(e)}") from None
    return data


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
