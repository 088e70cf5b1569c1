"""Loading a contract: `load_contract` reads the capped YAML, validates it against `Contract` and its
study's arm configs and returns a `LoadedContract` with its sha256; every error names the file, the
line, the field path and what is expected. `load_contract_cached` loads each file version once.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

from pydantic import ValidationError

from gates.contract._bounds import canonical_json
from gates.contract._conditions import Trend
from gates.contract._errors import _dotted, _explain, _line_for
from gates.contract._references import _check_references, _check_tuning
from gates.contract._schema import Contract
from gates.contract._yaml import load_yaml
from gates.errors import UserError, UserErrors, did_you_mean
from gates.study import Study


class LoadedContract:
    """A validated contract with where it came from, its study and its hash."""

    def __init__(
        self,
        contract: Contract,
        path: Path,
        study: Study,
        arm_configs: dict,
        sha256: str,
        lines: dict[tuple, int],
    ):
        self.contract = contract
        self.path = path
        self.study = study
        self.arm_configs = arm_configs  # arm name -> study.Config instance (defaults filled in)
        self.sha256 = sha256
        self.lines = lines  # field path -> line in the YAML file
        # the tuning record of the run being judged (gates.execution._tuning: a tuned arm's search may
        # have stopped at an edge): a copy with it is made after tuning, and by verify from the evidence
        self.tuning_record: dict | None = None
        # its claim family (gates.record.family_of: the alpha its verdict is judged at), given to a copy
        # by whoever reads it with the record (admit, gates run, verify, rederive); None: its own alpha
        self.family = None
        self._frozen = True

    def __setattr__(self, name: str, value) -> None:
        # immutable once loaded: what a run learns (tuned configs, the tuning record, the claim family)
        # goes to a copy (`replace`), so no caller's contract changes under it
        if getattr(self, "_frozen", False):
            raise AttributeError(f"LoadedContract is immutable: replace({name}=...) makes a copy")
        object.__setattr__(self, name, value)

    def replace(self, **changes) -> LoadedContract:
        """A copy with `changes` (tuning_record, family, arm_configs) set."""
        new = copy.copy(self)
        for name, value in changes.items():
            if not hasattr(self, name):
                raise AttributeError(f"LoadedContract has no {name!r}")
            object.__setattr__(new, name, value)
        return new

    def ceilings(self) -> dict[str, dict]:
        """condition label -> its ceiling ({why, value | metric | arm}): the contract's `ceiling`, else what
        the study knows for the condition's arm and metric (`Study.ceiling`); threshold and compare only."""
        out = {}
        for name, i, c in self.contract.conditions():
            if isinstance(c, Trend):
                continue
            if c.ceiling is not None:
                out[f"{name}[{i}]"] = c.ceiling.model_dump(exclude_none=True)
                continue
            config = self.arm_configs.get(c.arm)
            known = self.study.ceiling(c.metric, config) if config is not None else None
            if known is not None:
                out[f"{name}[{i}]"] = {
                    k: v
                    for k, v in (
                        ("why", known.why),
                        ("value", known.value),
                        ("metric", known.metric),
                    )
                    if v is not None
                }
        return out

    def recorded_in(self, runs_root: Path) -> bool:
        """Whether runs_root holds evidence recorded for exactly this contract (same sha256)."""
        evidence = Path(runs_root) / self.contract.id / "evidence.json"
        try:
            return (
                json.loads(evidence.read_text(encoding="utf-8")).get("contract_sha256")
                == self.sha256
            )
        except (OSError, ValueError, AttributeError):
            return False

    def error(self, loc: tuple, msg: str) -> UserError:
        """A UserError pointing at the file, line and field `loc` of this contract."""
        return UserError(
            msg, file=str(self.path), line=_line_for(self.lines, loc), field=_dotted(loc)
        )

    @property
    def id(self) -> str:
        return self.contract.id


MAX_CONTRACT_BYTES = 256 * 1024


def load_contract(path: str | Path) -> LoadedContract:
    """Load, validate and hash a contract; raise UserError(s) that point at file:line:field."""
    from gates.study import get_study, study_names

    path = Path(path)
    shown = str(path)
    data, lines = load_yaml(path, max_bytes=MAX_CONTRACT_BYTES)
    if not isinstance(data, dict):
        raise UserError(
            "a contract is a mapping of fields (id, claim, study, arms, ...)", file=shown, line=1
        )

    def err(loc: tuple, msg: str) -> UserError:
        return UserError(msg, file=shown, line=_line_for(lines, loc), field=_dotted(loc))

    try:
        contract = Contract.model_validate(data)
    except ValidationError as e:
        raise UserErrors(
            [err(tuple(x["loc"]), _explain(x, Contract)) for x in e.errors()]
        ) from None

    try:
        study = get_study(contract.study)
    except KeyError:
        raise err(
            ("study",),
            f"unknown study {contract.study!r}{did_you_mean(contract.study, study_names())};"
            f" registered: {', '.join(study_names()) or 'none'}",
        ) from None

    errors: list[UserError] = []
    arm_configs = {}
    for arm, raw in contract.arms.items():
        try:
            arm_configs[arm] = study.Config.model_validate(raw)
        except ValidationError as e:
            errors += [
                err(("arms", arm) + tuple(x["loc"]), _explain(x, study.Config)) for x in e.errors()
            ]
    errors += _check_references(contract, study, err)
    if contract.tuning is not None:
        errors += _check_tuning(contract, study, err)
    if errors:
        raise UserErrors(errors)

    canonical = contract.model_dump(mode="json", exclude_unset=True)
    canonical["arms"] = {
        a: c.model_dump(mode="json", exclude_unset=True) for a, c in arm_configs.items()
    }
    sha = hashlib.sha256(canonical_json(canonical).encode()).hexdigest()
    loaded = LoadedContract(contract, path, study, arm_configs, sha, lines)
    return loaded


_LOADED: dict[tuple, LoadedContract | None] = {}  # (path, mtime, size) -> the contract it loaded to


def load_contract_cached(path: Path) -> LoadedContract | None:
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _LOADED:
        try:
            _LOADED[key] = load_contract(path)
        except UserError:
            _LOADED[key] = None
    return _LOADED[key]
