"""The checks of a contract before any training step, one implementation for every command: what `gates
check` reports, what `gates run` and `gates certify` require, and what `gates verify` applies to
every contract of the contracts folder that has no evidence yet (a contract verify passes is one
that check accepts and run runs).

`load_checked` (no `gates new` placeholder left, the contract and its study load),
`require_in_contracts` (the file is the one contract with its id in the project's contracts folder),
`admit` (those, then a contract unchanged since its evidence, today's design rules and its claim
family's alpha and seeds), `check_contract` (admitted, then the preflight's measurements and
refusals) and `contract_errors` (the refusals of all of these as a list).
"""

from __future__ import annotations

from pathlib import Path

from gates.contract import LoadedContract
from gates.errors import UserError, UserErrors
from gates.execution._preflight import PreflightReport, preflight


def load_checked(path: Path) -> LoadedContract:
    """Load a contract for check or run: refused while `gates new` placeholders are left (each named),
    and a study that cannot be used is named at the contract's `study` line."""
    from gates.contract import MAX_CONTRACT_BYTES, load_contract, load_yaml, require_filled
    from gates.study import StudyError

    require_filled(path)
    try:
        return load_contract(path)
    except StudyError as e:
        _, lines = load_yaml(path, max_bytes=MAX_CONTRACT_BYTES)
        raise UserError(
            e.message, file=str(path), line=lines.get(("study",)), field="study"
        ) from None


def require_in_contracts(loaded: LoadedContract, contracts_dir: Path) -> None:
    """A claim's contract lives in the project's contracts folder, where `gates verify`, `status` and the
    dashboard find it by its id: a file elsewhere (whose evidence verify would call LOST), or a second
    file with an id another contract there has, is refused."""
    from gates.contract import MAX_CONTRACT_BYTES, load_yaml

    contracts_dir = Path(contracts_dir)
    folder = contracts_dir.resolve()
    path = loaded.path.resolve()
    if path.parent != folder:
        raise UserError(
            f"the contract is outside the project's contracts folder {contracts_dir}/ (where `gates "
            f"verify` finds a claim's contract by its id); expected contracts/{loaded.id}.yaml: copy it "
            f"there (cp {loaded.path} {contracts_dir / (loaded.id + '.yaml')}) and use that file, or "
            f"pass --contracts-dir",
            file=str(loaded.path),
            field="id",
        )
    others = []
    for other in sorted(list(folder.glob("*.yaml")) + list(folder.glob("*.yml"))):
        if other == path:
            continue
        try:
            data, _ = load_yaml(other, max_bytes=MAX_CONTRACT_BYTES)
        except UserError:
            continue
        if isinstance(data, dict) and data.get("id") == loaded.id:
            others.append(other.name)
    if others:
        raise UserError(
            f"{', '.join(others)} in {contracts_dir}/ also has id {loaded.id!r}; expected exactly one "
            f"contract per id (a new version needs a new id)",
            file=str(loaded.path),
            field="id",
        )


def admit(path: Path, runs_dir: Path, contracts_dir: Path) -> LoadedContract:
    """The contract at `path`, loaded (`load_checked`), in the contracts folder (`require_in_contracts`),
    unchanged since its evidence, if any (said as such, before any rule), and following today's design
    rules unless its evidence was recorded before them: what `gates run` requires before its plan."""
    from gates.design import require_current_rules
    from gates.execution._runner import check_existing_evidence

    loaded = load_checked(Path(path))
    require_in_contracts(loaded, contracts_dir)
    check_existing_evidence(loaded, runs_dir)
    require_current_rules(loaded, runs_dir)
    return require_family(loaded, runs_dir, contracts_dir)


def require_family(loaded: LoadedContract, runs_dir: Path, contracts_dir: Path) -> LoadedContract:
    """The contract with its claim family (`family`: the alpha its verdict is judged at); for a
    contract not yet recorded, a version its family cannot take refused (`family_errors`)."""
    from gates.record import family_errors, family_of

    loaded = loaded.replace(family=family_of(loaded.contract, runs_dir, contracts_dir))
    if not loaded.recorded_in(runs_dir):
        errors = family_errors(loaded, loaded.family, runs_dir)
        if errors:
            raise UserErrors(errors)
    return loaded


def check_contract(
    path: Path, runs_dir: Path, contracts_dir: Path, *, here: bool = True
) -> tuple[LoadedContract, PreflightReport]:
    """`gates check`: the contract admitted (`admit`: raises its refusals), then its preflight (measured
    parameters and FLOPs, the declared bounds: its refusals in the report's `errors`). `here=False`
    leaves out whether this machine can run each arm (its pinned device, its corpus fetched)."""
    loaded = admit(path, runs_dir, contracts_dir)
    return loaded, preflight(loaded, here=here)


def contract_errors(path: Path, runs_dir: Path, contracts_dir: Path) -> list[UserError]:
    """Every refusal `gates check` gives the contract at `path` (empty when it would say "ready to
    run"), each naming file, line and field; whether this machine can run its arms is not asked (that is
    a machine's concern, not the contract's: `gates verify` in CI need not hold a study's corpus)."""
    try:
        _, report = check_contract(path, runs_dir, contracts_dir, here=False)
    except UserErrors as e:
        return list(e.errors) or [e]
    except UserError as e:
        return [e]
    return list(report.errors)
