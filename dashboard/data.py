"""What the dashboard shows, loaded from runs/*/evidence.json, contracts/ and (when reachable) MLflow.

Claim checks come from `gates.verify.claims` (the files phase `gates status` shows: evidence, contract hash,
claims history, staleness; `gates verify` adds the re-derivation of every verdict); they are cached
until a file under runs/ or contracts/ changes. Metric histories of finished runs never change, so
they are cached by run id. Nothing here writes anywhere.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gates.dashboard.diff import contract_diff
from gates.errors import UserError
from gates.record import EVIDENCE, REPORT, Evidence, RegimeLeft, evidence_dir, read_evidence
from gates.verify import (
    CONTRACT_AMBIGUOUS,
    CONTRACT_EDITED,
    CONTRACT_ID_CHANGED,
    CONTRACT_MISSING,
    CONTRACT_UNLOADABLE,
    EVIDENCE_FOREIGN,
    EVIDENCE_MISSING,
    EVIDENCE_UNREADABLE,
    ClaimCheck,
    claims,
)

# hash status of a claim: its contract file's sha256 against the sha256 its evidence recorded
HASH_OK, HASH_EDITED, HASH_NO_EVIDENCE = "ok", "edited after evidence", "evidence missing"
HASH_WITHDRAWN = "not checked (withdrawn)"
# why the hash was not compared, by the code of the problem that stopped the check before it
_NOT_COMPARED = {
    CONTRACT_EDITED: HASH_EDITED,
    EVIDENCE_MISSING: HASH_NO_EVIDENCE,
    CONTRACT_MISSING: "contract missing",
    CONTRACT_UNLOADABLE: "contract does not load",
    CONTRACT_ID_CHANGED: "contract id changed",
    EVIDENCE_FOREIGN: "evidence of another contract",
    EVIDENCE_UNREADABLE: "evidence unreadable",
    CONTRACT_AMBIGUOUS: "contract ambiguous",
}


@dataclass
class Claim:
    """One row of the index: a contract with or without evidence."""

    contract_id: str
    claim: str
    verdict: str | None  # None: pending (no evidence)
    created_at: str | None
    check: str  # the check's status: ok | lost | pending | withdrawn
    hash_status: str
    problems: list[str] = field(default_factory=list)  # gates.verify Problems: str with a .code
    # the claims history and the code (gates.verify's annotations)
    withdrawn: bool = False
    withdrawal: str | None = None  # reason and time
    supersedes: str | None = None
    superseded_by: list[str] = field(default_factory=list)
    stale: bool = False  # the code changed since the evidence
    stale_files: list[str] = field(default_factory=list)
    stale_note: str = ""
    rule_flags: list[str] = field(default_factory=list)  # rules the recorded contract predates
    # every attempt on the record (gates.record.claim_attempts, as `gates status` shows them)
    attempts: int = 0
    earlier: list[str] = field(
        default_factory=list
    )  # a line per earlier attempt ("attempt 1 invalid (...)")
    # claims that stand together (gates.record._siblings)
    shared_runs: dict[str, list[str]] = field(
        default_factory=dict
    )  # other claim -> "arm/seed N" it ran too
    regime_left: RegimeLeft | None = None  # a superseded sibling left this claim's regime
    # what the recorded verdict says did not work as designed (from the evidence; the index shows them in brief)
    not_run: list[str] = field(default_factory=list)  # arms without a completed run
    beyond_ceiling: list[str] = field(
        default_factory=list
    )  # conditions whose bar the best possible arm cannot reach
    tuning_edges: list[str] = field(
        default_factory=list
    )  # tuned arms whose search stopped at an edge
    study: str = ""  # the evidence's study (the contract's while pending): the board filters by it
    certified: str | None = None  # the latest `gates certify` entry, in a line
    family: str | None = None  # its claim family and the alpha it was judged at (describe_family)


def hash_status(check: ClaimCheck) -> str:
    if check.status == "pending":
        return HASH_NO_EVIDENCE
    if check.status == "withdrawn":
        return HASH_WITHDRAWN
    hash_ok = getattr(check, "hash_ok", None)
    if (
        hash_ok is not None
    ):  # compared: the record may still be lost for other reasons (see problems)
        return HASH_OK if hash_ok else HASH_EDITED
    if check.status == "ok":
        return HASH_OK
    for code in check.codes:  # the check stopped before the hash: say why
        if code in _NOT_COMPARED:
            return _NOT_COMPARED[code]
    return "not compared"


@dataclass
class ContractView:
    claim: Claim
    evidence: Evidence | None
    contract: object | None  # gates.contract.Contract, when its file still hashes to the evidence
    metrics: list[str]  # the metrics the decision, gate 5 and the stop rules read
    histories: dict[tuple[str, int], dict[str, list[tuple[int, float]]]]
    store_note: str | None  # why there are no (or only some) curves
    # every metric the runs logged with a curve (the decision's first, train/val/test side by side)
    curve_metrics: list[str] = field(default_factory=list)
    final_only: list[str] = field(default_factory=list)  # logged at too few steps to be a curve
    # what changed from the contract this one supersedes (None: it supersedes none)
    predecessor: Predecessor | None = None


@dataclass
class Predecessor:
    """The contract a claim supersedes, and the change from it (`gates.dashboard.diff`)."""

    contract_id: str
    changes: list  # diff.Change, in the newer contract's order
    note: str | None = None  # why there is no diff (a contract file gone or unreadable)


class Store:
    """The MLflow tracking store, opened lazily and never created: a missing SQLite file stays missing."""

    def __init__(self, uri: str):
        self.uri = uri
        self._client = None
        self._lock, self._read_lock = threading.Lock(), threading.Lock()
        self._histories: dict[tuple[str, str], list[tuple[int, float]]] = {}
        self._keys: dict[str, list[str]] = {}  # run id -> the metrics it logged

    def sqlite_path(self) -> Path | None:
        if not self.uri.startswith("sqlite:"):
            return None
        return (
            Path(self.uri[len("sqlite:///") :]) if self.uri.startswith("sqlite:///") else Path("")
        )

    def client(self):
        """(client, None) or (None, why the store cannot be read)."""
        path = self.sqlite_path()
        if path is not None and not path.is_file():
            return None, (
                f"MLflow store {self.uri} not found (mlflow.db is not committed: `gates run` creates "
                f"it); showing the evidence without learning curves"
            )
        with self._lock:
            if self._client is None:
                try:
                    from gates.record import open_client

                    client = open_client(
                        self.uri, create=False
                    )  # read-only: never builds or upgrades a store
                    client.search_experiments(max_results=1)  # reachable and readable?
                    self._client = client
                # gates.record._store: a half-built or damaged SQLite store, one line with the fix
                except UserError as e:
                    return None, e.render()
                except (
                    Exception
                ) as e:  # an unreachable server, a foreign schema: say so, never crash
                    return (
                        None,
                        f"MLflow store {self.uri} cannot be read ({type(e).__name__}: {str(e)[:200]})",
                    )
            return self._client, None

    def metric_keys(self, client, run_id: str) -> list[str]:
        """The metrics a run logged (the study's train, validation and test metrics alike); none
        where the store does not have the run (evidence recorded into another store: the histories
        read next say that it has no metric history, and a store that fails says so there)."""
        with self._read_lock:
            if run_id not in self._keys:
                try:
                    self._keys[run_id] = sorted(client.get_run(run_id).data.metrics)
                except Exception:
                    return []
            return self._keys[run_id]

    def history(self, client, run_id: str, metric: str) -> list[tuple[int, float]]:
        key = (run_id, metric)
        with (
            self._read_lock
        ):  # one reader at a time: SQLite connections are not shared across threads
            if key not in self._histories:
                by_step = {
                    m.step: m.value
                    for m in sorted(
                        client.get_metric_history(run_id, metric),
                        key=lambda m: (m.step, m.timestamp),
                    )
                }
                self._histories[key] = sorted(
                    by_step.items()
                )  # the final value is logged again at the last step
            return self._histories[key]


class Claims:
    """Every claim under runs_dir and contracts_dir, re-checked only when a file there changes."""

    def __init__(self, runs_dir: Path, contracts_dir: Path, store: Store):
        self.runs_dir, self.contracts_dir, self.store = Path(runs_dir), Path(contracts_dir), store
        self._lock = threading.Lock()
        self._key = None
        self._claims: dict[str, Claim] = {}
        self._loaded: dict[tuple, object] = {}  # (path, mtime, size) -> LoadedContract or None
        self._load_lock = (
            threading.Lock()
        )  # request threads fill _loaded: each contract is parsed once

    def _fingerprint(self) -> tuple:
        files = list(self.runs_dir.glob(f"*/{EVIDENCE}")) + list(self.contracts_dir.glob("*.y*ml"))
        files.append(self.runs_dir / "INDEX.jsonl")  # the claims history: withdrawals, entries
        files += self.runs_dir.glob(f"*/{REPORT}")  # verify checks verdict.md against the evidence
        files += _code_files()  # staleness: the code the evidence was computed with
        stats = []
        for f in sorted(files):
            try:
                st = f.stat()
            except OSError:
                continue
            stats.append((str(f), st.st_mtime_ns, st.st_size))
        return tuple(stats)

    def all(self) -> dict[str, Claim]:
        with self._lock:
            key = self._fingerprint()
            if key != self._key:
                self._claims = {
                    c.contract_id: self._claim(c) for c in claims(self.runs_dir, self.contracts_dir)
                }
                self._key = key
            return self._claims

    def _claim(self, check: ClaimCheck) -> Claim:
        ev = self.evidence(check.contract_id)
        text = ev.claim if ev is not None else ""
        study = str(ev.written("study", "")) if ev is not None else ""
        if not text or not study:
            loaded = self.contract(check.contract_id)
            text = text or (loaded.contract.claim if loaded else "")
            study = study or (loaded.contract.study if loaded else "")
        return Claim(
            check.contract_id,
            text,
            check.verdict,
            check.created_at,
            check.status,
            hash_status(check),
            list(check.problems),
            check.withdrawn,
            check.withdrawal,
            check.supersedes,
            list(check.superseded_by),
            check.stale,
            list(check.stale_files),
            check.stale_note,
            list(check.rule_flags),
            attempts=getattr(check, "attempts", 0) or 0,
            earlier=list(getattr(check, "earlier", []) or []),
            shared_runs={k: list(v) for k, v in (getattr(check, "shared_runs", {}) or {}).items()},
            regime_left=getattr(check, "regime_left", None),
            **_design_flags(ev),
            study=study,
            certified=check.certified,
            family=check.family,
        )

    def evidence(self, contract_id: str) -> Evidence | None:
        try:
            return read_evidence(evidence_dir(self.runs_dir, contract_id) / EVIDENCE)
        except ValueError:
            return None

    def contract(self, contract_id: str, evidence: Evidence | None = None):
        """The LoadedContract with this id in contracts_dir (never at a path the evidence names), or None."""
        from gates.contract import load_contract

        candidates = [
            self.contracts_dir / f"{contract_id}.yaml",
            self.contracts_dir / f"{contract_id}.yml",
        ]
        candidates += sorted(self.contracts_dir.glob("*.y*ml"))
        for path in candidates:
            try:
                st = path.stat()
            except OSError:
                continue
            key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
            with self._load_lock:
                if key not in self._loaded:  # parsing a contract takes tens of milliseconds
                    try:
                        self._loaded[key] = load_contract(path)
                    except UserError:
                        self._loaded[key] = None
                loaded = self._loaded[key]
            if loaded is not None and loaded.id == contract_id:
                return loaded
        return None

    def view(self, contract_id: str) -> ContractView | None:
        claim = self.all().get(contract_id)
        if claim is None:
            return None
        ev = self.evidence(contract_id)
        loaded = self.contract(contract_id, ev)
        contract = (
            loaded.contract
            if loaded and (ev is None or loaded.sha256 == ev.contract_sha256)
            else None
        )
        metrics = _plotted_metrics(contract, ev)
        histories, note = {}, None
        if ev is not None:
            histories, note = self._histories(ev, metrics)
        curves, final_only = curve_metrics(metrics, histories)
        return ContractView(
            claim,
            ev,
            contract,
            metrics,
            histories,
            note,
            curves,
            final_only,
            self._predecessor(claim),
        )

    def _predecessor(self, claim: Claim) -> Predecessor | None:
        """The change from the contract this claim supersedes: the two contract files' YAML mappings
        compared field by field."""
        if not claim.supersedes:
            return None
        mappings = []
        for cid in (claim.supersedes, claim.contract_id):
            data, why = self.contract_yaml(cid)
            if data is None:
                return Predecessor(claim.supersedes, [], why)
            mappings.append(data)
        return Predecessor(claim.supersedes, contract_diff(*mappings))

    def contract_yaml(self, contract_id: str) -> tuple[dict | None, str | None]:
        """The contract file's YAML mapping as written (None and why, when there is none)."""
        from gates.contract import MAX_CONTRACT_BYTES, load_yaml

        loaded = self.contract(contract_id)
        path = loaded.path if loaded is not None else self.contracts_dir / f"{contract_id}.yaml"
        try:
            data, _ = load_yaml(Path(path), MAX_CONTRACT_BYTES)
        except UserError as err:
            return None, f"{contract_id}: {err.render()}"
        if not isinstance(data, dict):
            return None, f"{path} holds no YAML mapping"
        return data, None

    def _histories(self, ev: Evidence, metrics: list[str]):
        """Every metric's history for each run of the evidence: those the decision reads and the
        rest the run logged (train and validation curves included)."""
        client, why = self.store.client()
        if client is None:
            return {}, why
        histories, missing = {}, []
        never = [r for r in ev.runs if not r.mlflow_run_id]  # skipped after its arm kept failing
        for r in ev.runs:
            run_id = r.mlflow_run_id
            if not run_id:
                continue
            try:
                logged = self.store.metric_keys(client, run_id)
                wanted = list(dict.fromkeys(metrics + logged))
                series = {m: self.store.history(client, run_id, m) for m in wanted}
            except Exception as e:
                return (
                    histories,
                    f"MLflow store {self.store.uri} failed reading run {run_id}: {type(e).__name__}: {e}",
                )
            if any(series.values()):
                histories[(r.arm, r.seed)] = series
            else:
                missing.append(f"{r.arm}/seed {r.seed}")
        notes = []
        if missing:
            recorded = ev.mlflow.written("tracking_uri", "?") if ev.mlflow is not None else "?"
            notes.append(
                f"{len(missing)} of {len(ev.runs)} runs have no metric history in {self.store.uri} "
                f"(the evidence was recorded into {recorded}): {', '.join(missing[:6])}"
                + (" ..." if len(missing) > 6 else "")
            )
        if never:
            shown = ", ".join(f"{r.arm}/seed {r.seed} ({r.status})" for r in never[:6])
            notes.append(
                f"{len(never)} of {len(ev.runs)} runs have no MLflow run (never started: "
                f"{shown}{' ...' if len(never) > 6 else ''})"
            )
        return histories, "; ".join(notes) or None


def _design_flags(ev: Evidence | None) -> dict:
    """The evidence's verdict-level fields that say the experiment did not run as designed, in brief."""
    if ev is None:
        return {}
    return {
        "not_run": [x.arm for x in ev.not_run],
        "beyond_ceiling": [x.condition for x in ev.beyond_ceiling],
        "tuning_edges": list(ev.tuning_edges),
    }


def _plotted_metrics(contract, ev: Evidence | None) -> list[str]:
    """The metrics a reviewer needs to see move (as in the MLflow review plots); from the evidence
    alone when the contract file is gone or was edited."""
    if contract is not None:
        from gates.record import plotted_metrics

        return plotted_metrics(contract)
    if ev is None:
        return []
    names = [ev.falsifiable_point.metric] if ev.falsifiable_point is not None else []
    arms = sorted(ev.settings.arm_configs, key=len, reverse=True)
    for c in ev.conditions:
        for term in c.values:
            arm = next((a for a in arms if term.startswith(a + ".")), None)
            names.append(term[len(arm) + 1 :] if arm else term.split(".", 1)[-1])
    return list(dict.fromkeys(names))


MIN_CURVE_STEPS = 3  # a metric logged at fewer steps in every run is a final value, not a curve
SPLITS = ("train", "val", "validation", "test")  # metric prefixes shown side by side, in this order


def curve_metrics(
    first: list[str], histories: dict[tuple[str, int], dict[str, list[tuple[int, float]]]]
) -> tuple[list[str], list[str]]:
    """(the metrics drawn as curves, those logged at too few steps to be one). Grouped by what they
    measure, a metric's train, validation and test versions side by side (train_loss, val_loss,
    test_loss); the groups of the metrics in `first` (the decision's) lead, the rest follow by name."""
    steps: dict[str, int] = {}
    for series in histories.values():
        for metric, points in series.items():
            steps[metric] = max(steps.get(metric, 0), len(points))
    logged = [m for m in dict.fromkeys(first + sorted(steps)) if steps.get(m)]

    def stem(metric: str) -> str:
        head, _, rest = metric.partition("_")
        return rest if head in SPLITS and rest else metric

    def split(metric: str) -> int:
        head = metric.partition("_")[0]
        return SPLITS.index(head) if head in SPLITS and stem(metric) != metric else len(SPLITS)

    groups = list(dict.fromkeys(stem(m) for m in logged))
    ordered = sorted(logged, key=lambda m: (groups.index(stem(m)), split(m), m))
    curves = [m for m in ordered if steps[m] >= MIN_CURVE_STEPS]
    return curves, [m for m in ordered if steps[m] < MIN_CURVE_STEPS]


CODE_FILES_TTL = (
    10.0  # seconds the list of watched code files is reused (their stats are taken every time)
)
_code_files_cache: tuple[float, list[Path]] | None = None
_code_files_lock = threading.Lock()


def _code_files() -> list[Path]:
    """The files staleness depends on: gates/, models/ and the packages of studies from elsewhere.

    Finding them reads every installed study distribution's metadata (tens of milliseconds), which a
    burst of page loads must not pay per request: the list is reused for CODE_FILES_TTL seconds. A change
    to any file on it is still seen at once (`Claims._fingerprint` stats each one per request); only a
    newly installed study package waits that long."""
    global _code_files_cache
    from gates.record import watched_paths

    with _code_files_lock:
        now = time.monotonic()
        if _code_files_cache is None or now - _code_files_cache[0] > CODE_FILES_TTL:
            _code_files_cache = (now, watched_paths())
        return list(_code_files_cache[1])


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
