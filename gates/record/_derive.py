"""One derivation: a contract and the runs recorded for it -> its evidence.

`derive` is what `gates run` (gates.execution's `finish`), `gates rederive` and `gates verify` all go
through: the verdict engine on the recorded per-seed values (`judge_claim`) and every other field of
the evidence that today's code derives from them and from the contract (the verdict's fields, gates 3
and 5 as measured, the design, regime, rule flags and claim family), set in the record in place.

It is pure: no MLflow, no file read or written. What the callers read elsewhere comes in as
arguments (provenance, preflight, pilots, the tuning record, the claim family on `loaded.family`,
the time of the run), and what they write goes out as data, so the same inputs give the same
evidence.json, byte for byte. A new run's record is laid out by `run_facts`; a stored one is the
evidence as stored (plain JSON). Its runs become records (`RunRecord`) here, once, for the verdict
engine; the record's data keeps them as they were written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import gates
from gates.contract import LoadedContract
from gates.design import rule_flags
from gates.entities import (
    ConvergenceRecord,
    RunRecord,
    TrialRecord,
    Verdict,
    as_json,
    json_safe,
)
from gates.inference import judge_claim, predictions
from gates.record._evidence import EVIDENCE_FORMAT, Evidence, SignalRecord
from gates.record._family import family_record
from gates.record._siblings import regime_of

# derived fields written only when not empty: a stored record's are dropped before deriving, so a
# field today's code no longer derives does not survive a re-derivation
OPTIONAL_DERIVED = ("not_run", "beyond_ceiling", "tuning_edges", "design", "regime", "family")


@dataclass(frozen=True)
class Derivation:
    """What `derive` gives: the verdict engine's result and the evidence's data (plain JSON, key for key
    in the order evidence.json lists it); `evidence` checks the data into an Evidence."""

    verdict: Verdict
    data: dict

    @cached_property
    def evidence(self) -> Evidence:
        return Evidence.of(self.data)  # checked as `read_evidence` checks evidence.json


def derive(
    loaded: LoadedContract,
    recorded: Evidence | dict,
    *,
    tuning: dict | None = None,
    after: dict | None = None,
) -> Derivation:
    """The evidence of `loaded` from `recorded`: the record's data (a new run's `run_facts`, or stored
    evidence: read, or as plain JSON) with every derived field set by today's code: kept in place where the
    record has it, appended where it has not. `tuning`: the tuning record the runs ran under (the
    tuned arms whose search stopped at an edge: `loaded.tuning_record` is not read); `after`: fields
    the caller records beside the verdict (a new attempt's shared runs and attempt), appended last.
    The claim family judged at is `loaded.family` (set by the caller, which reads the other claims)."""
    judged = loaded if loaded.tuning_record is tuning else loaded.replace(tuning_record=tuning)
    stored, runs = _data_and_runs(recorded)
    record = {k: v for k, v in stored.items() if k not in OPTIONAL_DERIVED}
    result = judge_claim(judged, runs)
    data = verdict_fields(loaded, record, result, runs)
    if tuning is not None:
        data["tuning"] = tuning
    return Derivation(result, {**data, **(after or {})})


def _data_and_runs(recorded: Evidence | dict) -> tuple[dict, list[RunRecord]]:
    """The record as plain JSON (what the evidence is written from) and its runs as records (what the
    verdict engine reads): read evidence has both; plain JSON's runs are checked once here."""
    if isinstance(recorded, Evidence):
        return recorded.as_dict(), list(recorded.runs)
    return recorded, run_records(recorded["runs"])


def run_records(runs: list) -> list[RunRecord]:
    """A record's runs as the verdict engine reads them: each stored run (plain JSON) checked into a
    `RunRecord`, as `read_evidence` checks it (a run that is a record already stays as it is)."""
    return [RunRecord.model_validate(r) for r in runs]


def first_signals(evidence: dict) -> list[SignalRecord]:
    """Each run's first signal as the record's falsifiable point lists it (gate 5, as measured);
    evidence from before gate 5 was recorded has no falsifiable point: none."""
    point = evidence.get("falsifiable_point") or {}
    return [SignalRecord.model_validate(s) for s in point.get("runs", [])]


def verdict_fields(
    loaded: LoadedContract, evidence: dict, result: Verdict, runs: list[RunRecord]
) -> dict:
    """The parts of an evidence record that the verdict engine derives from its runs: `evidence`'s data
    (plain JSON) with them set, keys kept in place and new ones last (`derive`'s second half); `runs`:
    its runs as records (`run_records`), what the engine judged. Each part is read from the `Verdict`
    and written as its records write themselves (`as_json`: `as_dict()`, NaN as null)."""
    return {
        **evidence,
        "verdict": result.verdict,
        "reasons": as_json(result.reasons),
        "settle": as_json(result.settle),
        "conditions": as_json(result.conditions),
        "halts": as_json(result.halts),
        "lost": as_json(result.lost),
        **({"controls": as_json(result.controls)} if loaded.contract.controls else {}),
        **({"looks": as_json(result.looks)} if loaded.contract.sequential is not None else {}),
        # written only when not empty (OPTIONAL_DERIVED)
        **({"not_run": as_json(result.not_run)} if result.not_run else {}),
        **({"beyond_ceiling": as_json(result.beyond_ceiling)} if result.beyond_ceiling else {}),
        **({"tuning_edges": as_json(result.tuning_edges)} if result.tuning_edges else {}),
        "engine_version": result.engine_version,
        "settings": {**evidence["settings"], "correction": result.correction},
        "predictions": predictions(loaded.contract, runs, first_signals(evidence)),
        **{
            k: v
            for k, v in (
                ("design", contract_design(loaded.contract)),
                ("regime", regime_of(loaded)),
            )
            if v
        },
        "rule_flags": list(rule_flags(loaded)),
        **({"family": family} if (family := family_record(loaded)) else {}),
    }


def run_facts(
    loaded: LoadedContract,
    provenance,
    runs: list[gates.entities.RunRecord],
    *,
    preflight: dict,
    mlflow: dict,
    created_at: str,
    contract_path: str,
    pilots: list[dict],
) -> dict:
    """A new run's record before its verdict, laid out as evidence.json lists it: what the contract
    says, the code it ran under (`provenance`: gates.record.Provenance), the runs (one record per arm x
    seed, in job order), the preflight's report, where MLflow holds the runs, and the pilots run before
    it was registered. The verdict's fields are placeholders here, in their places; `derive` sets them.
    Each run is its record's JSON (`as_dict`: its keys in their order), its detail clipped."""
    c = loaded.contract
    return {
        "format": EVIDENCE_FORMAT,
        "contract_id": c.id,
        "contract_path": contract_path,
        "contract_sha256": loaded.sha256,
        "claim": c.claim,
        "source": c.source,
        "study": c.study,
        "supersedes": c.supersedes,
        "verdict": None,
        "reasons": [],
        "settle": [],
        "git_commit": provenance.git_commit,
        "git_dirty": provenance.git_dirty,
        "code_sha256": provenance.code_sha256,
        "code_files": provenance.code_files,
        **(
            {"study_package": provenance.study_package}
            if getattr(provenance, "study_package", None)
            else {}
        ),
        "gates_version": gates.__version__,
        "created_at": created_at,
        "settings": {
            "alpha": c.decision.alpha,
            "evaluation": c.decision.evaluation,
            "correction": None,
            "seeds": list(c.seeds),
            "budget": c.budget.model_dump(),
            "arm_configs": {
                a: cfg.model_dump(mode="json") for a, cfg in loaded.arm_configs.items()
            },
        },
        "mlflow": mlflow,
        "preflight": preflight,
        "falsifiable_point": {
            **c.preflight.falsifiable_point.model_dump(exclude={"statement"}),
            "runs": [
                {"seed": r.seed, **r.first_signal.as_dict()}
                for r in runs
                if r.first_signal is not None
            ],
        },
        "runs": [
            {
                **r.as_dict(),
                "metrics": json_safe(r.metrics),
                "halt_detail": (r.halt_detail or None) and r.halt_detail[:2000],
            }
            for r in runs
        ],
        "conditions": [],
        "halts": [],
        # what the author could see before registering (gates pilot): on the record with the verdict
        **({"pilots": pilots} if pilots else {}),
    }


def contract_design(contract) -> dict:
    """What a contract declares about its design that a reader of the verdict must see beside it: the factor
    under test, other declared differences between compared arms, arms blind by construction, why its runs
    are not judged for convergence (only what it declares)."""
    declared = {
        "factor": contract.factor,
        "differences": contract.differences,
        "blind": contract.blind,
        "no_convergence": contract.no_convergence,
    }
    return {k: v for k, v in declared.items() if v}


def is_converged(rule, trend: ConvergenceRecord) -> bool:
    """What a recorded convergence trend says under `rule` (gates.contract.Convergence; a missing or
    non-finite trend: not converged): the flag a run records beside its trend, re-derived by verify."""
    rel = trend.rel_improvement
    return (
        rel is not None
        and trend.first_value is not None
        and trend.last_value is not None
        and rel <= rule.max_rel_improvement
    )


def best_trial(trials: list[TrialRecord], direction: str) -> TrialRecord | None:
    """The completed trial with the best finite value; ties go to the earliest trial (the tuning record's
    `best`, re-derived by verify)."""
    done = [
        t
        for t in trials
        if t.state == "completed" and t.value is not None and math.isfinite(t.value)
    ]
    if not done:
        return None
    sign = -1.0 if direction == "higher" else 1.0
    return min(done, key=lambda t: (sign * t.value, t.number))


def tuned_config(loaded: LoadedContract, arm: str, params: dict):
    """The config a tuned arm runs: its declared one with the best trial's params."""
    return loaded.study.Config.model_validate({**loaded.contract.arms[arm], **params})
