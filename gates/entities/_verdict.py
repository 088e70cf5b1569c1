"""The verdict entity (`Verdict`): what the verdict engine (gates.inference) reaches, and what a
run, `gates rederive` and `gates verify` write or compare as evidence."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from gates.entities._condition import ConditionRecord
from gates.entities._json import json_safe


@dataclass
class Verdict:
    """A claim's verdict as the verdict engine reaches it: the verdict and why, its conditions and
    controls as judged, what would settle it, and what kept it from standing on its runs (halts,
    lost values, arms not run, bars beyond the ceiling, tuning edges). `to_dict` is the JSON the
    evidence records; a sequential contract's looks are set by the engine after the last look."""

    verdict: str  # "supported" | "refuted" | "inconclusive" | "invalid"
    reasons: list[str]
    conditions: list[ConditionRecord]
    alpha: float
    evaluation: str
    correction: str
    settle: list[str] = field(default_factory=list)
    halts: list[dict] = field(default_factory=list)
    lost: list[dict] = field(
        default_factory=list
    )  # (arm, metric, seed, why) a condition reads but lacks
    # the engine that reached it (gates.inference.ENGINE_VERSION): given by the engine, never defaulted
    engine_version: str = field(kw_only=True)
    controls: list[ConditionRecord] = field(default_factory=list)
    looks: list[dict] = field(
        default_factory=list
    )  # a sequential contract's looks (gates.inference._sequential)
    not_run: list[dict] = field(default_factory=list)  # arms read without a completed run (invalid)
    beyond_ceiling: list[dict] = field(
        default_factory=list
    )  # conditions whose bar the best arm cannot reach
    tuning_edges: dict[str, str] = field(
        default_factory=dict
    )  # tuned arm -> why its search stopped at an edge

    def to_dict(self) -> dict:
        """The verdict as JSON data: each condition as its record writes it (`as_dict`)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["conditions"] = [c.as_dict() for c in self.conditions]
        data["controls"] = [c.as_dict() for c in self.controls]
        return json_safe(data)
