"""Evidence read leniently (`raw_view`, `EvidenceView`): for the readers that must not fail on a
malformed file (the claims history, staleness, siblings, successors, a withdrawn claim's last verdict).

`read_evidence` checks a file whole and refuses it when any field is wrong; these readers take what
they can from any JSON object. The shape checks live here, once: each field is typed, and None (or
empty) where the file lacks it or holds something else, as `IndexEntry` reads a history line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gates.record._evidence import FamilyRecord
from gates.record._files import MAX_EVIDENCE_BYTES, as_mapping, as_text, read_json_object


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _objects(v) -> list[dict]:
    """The JSON objects of a list (nothing from what is no list)."""
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


@dataclass(frozen=True)
class RunView:
    """A run's arm and seed."""

    arm: str | None
    seed: int | None


@dataclass(frozen=True)
class ConditionView:
    """A condition's list (`supported_if`, ...) and kind."""

    list_name: str | None
    kind: str | None


@dataclass(frozen=True)
class AttemptView:
    """The evidence's `attempt`: its number and the (number, verdict) of each earlier attempt."""

    number: int | None
    earlier: tuple[tuple[int | None, str | None], ...] = ()

    @classmethod
    def of(cls, data: dict) -> AttemptView:
        earlier = [
            (_int(a.get("number")), as_text(a.get("verdict")))
            for a in _objects(data.get("earlier"))
        ]
        return cls(_int(data.get("number")), tuple(earlier))


# the fields read as strings
_TEXTS = (
    "contract_id",
    "contract_sha256",
    "code_sha256",
    "study",
    "verdict",
    "created_at",
    "git_commit",
    "gates_version",
    "engine_version",
    "supersedes",
)


@dataclass(frozen=True)
class EvidenceView:
    """What the lenient readers read of an evidence file, each field None (or empty) where the file
    lacks it or holds another type; `data`, the JSON object as parsed (for a reader of plain JSON)."""

    data: dict = field(repr=False)
    contract_id: str | None = None
    contract_sha256: str | None = None
    code_sha256: str | None = None
    study: str | None = None
    verdict: str | None = None
    created_at: str | None = None
    git_commit: str | None = None
    gates_version: str | None = None
    engine_version: str | None = None
    supersedes: str | None = None
    regime: dict | None = None
    code_files: dict | None = None  # file -> sha256 of the code it ran under
    # settings': arm -> its config ({} where the config is no object), and the budget
    arm_configs: dict[str, dict] = field(default_factory=dict)
    budget: dict | None = None
    runs: tuple[RunView, ...] = ()
    conditions: tuple[ConditionView, ...] = ()
    rule_flags: tuple[str, ...] | None = None  # None: the evidence records no list of them
    family: FamilyRecord | None = None
    attempt: AttemptView | None = None

    @classmethod
    def of(cls, data: dict) -> EvidenceView:
        """The view of an evidence's JSON object."""
        settings = as_mapping(data.get("settings")) or {}
        configs = as_mapping(settings.get("arm_configs")) or {}
        flags = data.get("rule_flags")
        attempt = as_mapping(data.get("attempt"))
        return cls(
            data,
            **{name: as_text(data.get(name)) for name in _TEXTS},
            regime=as_mapping(data.get("regime")),
            code_files=as_mapping(data.get("code_files")),
            arm_configs={arm: as_mapping(c) or {} for arm, c in configs.items()},
            budget=as_mapping(settings.get("budget")),
            runs=tuple(
                RunView(as_text(r.get("arm")), _int(r.get("seed")))
                for r in _objects(data.get("runs"))
            ),
            conditions=tuple(
                ConditionView(as_text(c.get("list_name")), as_text(c.get("kind")))
                for c in _objects(data.get("conditions"))
            ),
            rule_flags=tuple(f for f in flags if isinstance(f, str))
            if isinstance(flags, list)
            else None,
            family=_family(data.get("family")),
            attempt=AttemptView.of(attempt) if attempt is not None else None,
        )


def _family(value) -> FamilyRecord | None:
    """The claim family an evidence records, or None where it records none or no well-formed one."""
    if not isinstance(value, dict):
        return None
    try:
        return FamilyRecord.model_validate(value)
    except ValueError:  # pydantic's ValidationError
        return None


def as_view(evidence: EvidenceView | dict | None) -> EvidenceView | None:
    """A view as it is, an evidence's JSON object viewed; None for anything else."""
    if isinstance(evidence, EvidenceView) or evidence is None:
        return evidence
    return EvidenceView.of(evidence) if isinstance(evidence, dict) else None


def raw_view(path: Path) -> EvidenceView | None:
    """The evidence at `path` viewed leniently, or None where it is unreadable or no JSON object (never
    blocks on a FIFO or reads past the evidence cap)."""
    data = read_json_object(Path(path), MAX_EVIDENCE_BYTES)
    return None if data is None else EvidenceView.of(data)
