"""Every claim and its check as far as the files go: what `gates status` and the dashboard show and
what `gates verify` starts from.

For each `runs/<id>/evidence.json` the files phase (`check_files`) checks the evidence's shape and the
repository's contract for its id (found by scanning the contracts folder, never at a path the
evidence names: exactly one file, hashing to the recorded sha256), importing no study and no
statistics. `claims` lists every claim so checked (or checked whole by a deeper check: `gates verify`
passes its re-derivation), with pending and withdrawn contracts, the claims history
(runs/INDEX.jsonl), supersession, attempts, siblings, the rules a contract predates and staleness.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from gates.contract import (
    MAX_CONTRACT_BYTES,
    LoadedContract,
    canonical_json,
    load_contract,
    load_yaml,
    placeholders,
    read_capped,
)
from gates.errors import UserError
from gates.record import (
    CERTIFICATION_IGNORED,
    EVIDENCE,
    REPORT,
    Evidence,
    EvidenceView,
    IndexEntry,
    annotate_siblings,
    check_certifications,
    check_history,
    claim_attempts,
    describe_family,
    describe_stale,
    design_of,
    evidence_dir,
    is_withdrawn,
    latest_entries,
    link_supersession,
    raw_view,
    read_evidence,
    render_report,
    staleness,
    successor_problem,
)
from gates.study import study_module
from gates.verify._claim import (
    CONTRACT_AMBIGUOUS,
    CONTRACT_EDITED,
    CONTRACT_ID_CHANGED,
    CONTRACT_INVALID,
    CONTRACT_MISSING,
    CONTRACT_UNLOADABLE,
    EVIDENCE_FOREIGN,
    EVIDENCE_MISSING,
    EVIDENCE_UNREADABLE,
    HISTORY,
    NOT_RUN,
    STALE,
    UNLINKED_SUCCESSOR,
    VERDICT_MD,
    ClaimCheck,
)


class ContractIndex(dict):
    """contract id -> path of the contract file with that id (a dict), read as YAML only (no study is
    imported), with what the scan found: `raw` (id -> the file's mapping), `duplicates` (id -> every
    file that has it) and `unloadable` (path -> its first error line: unreadable YAML or no id)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.raw: dict[str, dict] = {}
        self.duplicates: dict[str, list[Path]] = {}
        self.unloadable: dict[Path, str] = {}

    def add(self, contract_id: str, path: Path, raw: dict) -> None:
        if contract_id in self and Path(self[contract_id]) != Path(path):
            self.duplicates.setdefault(contract_id, [self[contract_id]]).append(path)
        self[contract_id], self.raw[contract_id] = path, raw


def find_contracts(contracts_root: Path) -> ContractIndex:
    """Every contract file of the contracts folder by its id, from its YAML (see ContractIndex)."""
    found = ContractIndex()
    for path in sorted(list(contracts_root.glob("*.yaml")) + list(contracts_root.glob("*.yml"))):
        try:
            data, _ = load_yaml(path, max_bytes=MAX_CONTRACT_BYTES)
        except UserError as e:
            found.unloadable[path] = e.render().splitlines()[0]
            continue
        contract_id = data.get("id") if isinstance(data, dict) else None
        if not isinstance(contract_id, str):
            found.unloadable[path] = f"{path}: id: required field is missing"
            continue
        found.add(contract_id, path, data)
    return found


def check_files(
    evidence_path: Path, contracts: dict[str, Path]
) -> tuple[ClaimCheck, Evidence | None, LoadedContract | None]:
    """The files phase of a claim's check: the evidence's shape, the repository's contract for its
    id (exactly one file: `contracts` is a ContractIndex, or a plain id -> path mapping) and its
    sha256 against the recorded one. Imports no study and no statistics:
    the sha256 is computed from the contract's validated fields with its arm configs as written, and
    only where that differs from the record (an edited contract, or a value the study's config would
    coerce) is the contract loaded with its study to decide. Returns the check, the evidence (None
    when unreadable) and the contract when it was loaded."""
    contract_id = evidence_path.parent.name
    check = ClaimCheck(contract_id, "ok")
    try:
        ev = read_evidence(evidence_path)
    except ValueError as e:
        check.lose(
            EVIDENCE_UNREADABLE,
            [
                f"{evidence_path}: {e}; expected valid evidence: restore the committed file from "
                f"git, or run the contract again"
            ],
        )
        return check, None, None
    check.verdict, check.created_at = ev.verdict, ev.created_at
    if ev.contract_id != contract_id:
        check.lose(
            EVIDENCE_FOREIGN,
            [f"{evidence_path} records contract {ev.contract_id!r}, not {contract_id!r}"],
        )
        return check, ev, None
    duplicates = getattr(contracts, "duplicates", {}).get(contract_id)
    if duplicates:
        check.lose(
            CONTRACT_AMBIGUOUS,
            [
                f"contracts {', '.join(map(str, duplicates))} all have id {contract_id!r}; "
                f"expected exactly one contract per id (a new version needs a new id)"
            ],
        )
        return check, ev, None
    path = contracts.get(contract_id)
    if path is None or not Path(path).is_file():
        unloadable = getattr(contracts, "unloadable", {})
        broken = [why for p, why in unloadable.items() if Path(p).stem == contract_id]
        if broken:
            check.lose(CONTRACT_UNLOADABLE, [f"contract no longer loads: {broken[0]}"])
        else:
            check.lose(
                CONTRACT_MISSING,
                [
                    f"contract {contract_id!r} is missing (recorded at {ev.contract_path}); "
                    f"no contract file in the contracts folder has this id"
                ],
            )
        return check, ev, None
    loaded, sha = None, sha_as_written(getattr(contracts, "raw", {}).get(contract_id))
    if sha != ev.contract_sha256:  # edited, or written otherwise than its study makes of it
        try:
            loaded = load_contract(path)
        except UserError as e:
            message = f"contract no longer loads: {e.render().splitlines()[0]}"
            check.lose(CONTRACT_UNLOADABLE, [message])
            return check, ev, None
        if loaded.id != contract_id:
            check.lose(CONTRACT_ID_CHANGED, [f"{path} now has id {loaded.id!r}"])
            return check, ev, None
        sha = loaded.sha256
    check.hash_ok = sha == ev.contract_sha256
    if not check.hash_ok:
        named = ev.contract_path
        elsewhere = (
            f"; the evidence names {named}, but the contract with id {contract_id!r} is {path}"
            if named and not _same_file(named, path)
            else ""
        )
        check.lose(
            CONTRACT_EDITED,
            [
                f"{path} was edited after its evidence: sha256 {sha[:16]} != recorded "
                f"{ev.contract_sha256[:16]} (a new version needs a new id){elsewhere}"
            ],
        )
    check.lose(VERDICT_MD, check_report(evidence_path.parent, ev))
    return check, ev, loaded


def sha_as_written(raw: dict | None) -> str | None:
    """The contract's sha256 from its YAML with the arm configs as written (the hash of a loaded
    contract dumps them through the study's config, which may coerce or fill in values); None when
    the fields do not validate."""
    from pydantic import ValidationError

    from gates.contract import Contract

    if not isinstance(raw, dict):
        return None
    try:
        canonical = Contract.model_validate(raw).model_dump(mode="json", exclude_unset=True)
        canonical["arms"] = raw["arms"]
        return hashlib.sha256(canonical_json(canonical).encode()).hexdigest()
    except (ValidationError, TypeError, ValueError, KeyError):
        return None


def _same_file(recorded: str, path: Path) -> bool:
    try:
        return Path(recorded).resolve() == Path(path).resolve()
    except OSError:
        return False


def claims(
    runs_root: Path,
    contracts_root: Path,
    only: list[Path] | None = None,
    *,
    deep: Callable[[Path, ContractIndex], ClaimCheck] | None = None,
    today_rules: Callable[[Path], list[str] | None] | None = None,
    strict_code: bool = False,
    check_contract: Callable[[Path], list[str]] | None = None,
) -> list[ClaimCheck]:
    """Every claim in `runs_root` (or only the contracts named), each checked by its files phase
    (`check_files`) or by `deep` (`gates verify` passes its re-derivation, which starts with the
    files phase). A contract without evidence is pending when found by scanning, lost when named.

    Then the claims history (runs/INDEX.jsonl, gates.record._history): a broken chain, evidence changed or gone
    without an entry that says so, loses the claims concerned; a withdrawn claim is not checked and
    is reported as withdrawn. Each claim is annotated with its supersedes chain, its attempts, the
    claims it shares runs or a regime with, the rules its contract predates (`today_rules(path)`
    where given, else those its evidence recorded) and whether its code changed since its evidence
    (`strict_code`: a stale claim is lost).

    `check_contract(path)` (`gates verify` passes `gates check`'s checks: each refusal in a line) is
    asked of every contract file of the folder without evidence, and of every file there that does
    not read as a contract at all (broken YAML, no id): one it refuses is "broken", not pending."""
    runs_root, contracts_root = Path(runs_root), Path(contracts_root)
    contracts = find_contracts(contracts_root)
    index = latest_entries(runs_root)
    checks = []

    def check(evidence: Path) -> ClaimCheck:
        return deep(evidence, contracts) if deep else check_files(evidence, contracts)[0]

    if only:
        for path in only:
            named = load_contract(
                path
            )  # a contract named on the command line must load: else exit 2
            contracts.duplicates.pop(named.id, None)
            contracts[named.id] = Path(path)
            contracts.raw[named.id] = load_yaml(Path(path), max_bytes=MAX_CONTRACT_BYTES)[0]
            evidence = evidence_dir(runs_root, named.id) / EVIDENCE
            if is_withdrawn(index.get(named.id)):
                checks.append(_withdrawn(named.id, index[named.id]))
            elif evidence.exists():
                checks.append(check(evidence))
            else:
                lost = ClaimCheck(named.id, "lost")
                lost.lose(EVIDENCE_MISSING, [f"evidence missing: {evidence}"])
                checks.append(lost)
    else:
        with_evidence = set()
        for evidence in sorted(runs_root.glob(f"*/{EVIDENCE}")):
            contract_id = evidence.parent.name
            with_evidence.add(contract_id)
            if is_withdrawn(index.get(contract_id)):
                checks.append(_withdrawn(contract_id, index[contract_id]))
            else:
                checks.append(check(evidence))
        # files that are no contract (broken YAML, no id), by their name; a claim's own contract
        # that no longer loads is lost, named with its evidence
        unread = {
            Path(p).stem: Path(p)
            for p in (contracts.unloadable if check_contract is not None else ())
            if Path(p).stem not in with_evidence
        }
        for contract_id in sorted((set(contracts) | set(index) | set(unread)) - with_evidence):
            if is_withdrawn(index.get(contract_id)):
                checks.append(_withdrawn(contract_id, index[contract_id]))
            elif contract_id in contracts:
                checks.append(_pending(contract_id, contracts, check_contract))
            elif contract_id in unread:
                checks.append(_broken(contract_id, check_contract(unread[contract_id])))
            else:  # indexed, neither evidence nor contract: history.check says what disappeared
                checks.append(ClaimCheck(contract_id, "lost"))
    evidence = {
        c.contract_id: raw_view(evidence_dir(runs_root, c.contract_id) / EVIDENCE) for c in checks
    }
    for c in checks:
        ev = evidence[c.contract_id]
        if c.withdrawn and ev is not None:
            c.verdict, c.created_at = ev.verdict, ev.created_at
    _check_history(checks, runs_root, contracts, named=bool(only))
    _annotate(checks, runs_root, contracts, evidence, today_rules, strict_code=strict_code)
    return checks


def _pending(
    contract_id: str,
    contracts: ContractIndex,
    check_contract: Callable[[Path], list[str]] | None = None,
) -> ClaimCheck:
    """A contract without evidence: pending, or broken where `check_contract` refuses it."""
    if check_contract is not None:
        refused = check_contract(Path(contracts[contract_id]))
        if refused:
            return _broken(contract_id, refused)
    todo = placeholders(contracts.raw[contract_id], {}, str(contracts[contract_id]))
    pending = ClaimCheck(contract_id, "pending")
    left = (
        f"; {len(todo)} placeholder{'s' * (len(todo) > 1)} of `gates new` left "
        f"(`gates check` names them)"
        if todo
        else ""
    )
    pending.add(NOT_RUN, "no evidence yet (not run)" + left)
    return pending


def _broken(contract_id: str, refused: list[str]) -> ClaimCheck:
    """A contract file `gates check` refuses, each refusal a problem (file:line: field: ...)."""
    broken = ClaimCheck(contract_id, "broken")
    for message in refused or ["does not read as a contract; `gates check` says why"]:
        broken.add(CONTRACT_INVALID, message)
    return broken


def _withdrawn(contract_id: str, entry: IndexEntry) -> ClaimCheck:
    """A withdrawn claim: shown with its last verdict, not checked (it is no longer made)."""
    return ClaimCheck(
        contract_id,
        "withdrawn",
        withdrawn=True,
        withdrawal=f"{entry.reason or 'no reason given'} (withdrawn {entry.time})",
    )


def _check_history(
    checks: list[ClaimCheck], runs_root: Path, contracts: ContractIndex, *, named: bool
) -> None:
    """Lose the claims whose history (runs/INDEX.jsonl) is broken or does not vouch for their
    evidence."""
    lose_history(checks, check_history(runs_root, contracts), named=named)


def lose_history(checks: list[ClaimCheck], problems: dict[str, list[str]], *, named: bool) -> None:
    """Lose the claims with history problems (contract id -> problems); an id with no claim in
    `checks` becomes a lost one, unless only the claims `named` on the command line are checked."""
    by_id = {c.contract_id: c for c in checks}
    for contract_id, found in problems.items():
        check = by_id.get(contract_id)
        if check is None:
            if named:
                continue  # `gates verify CONTRACT...`: only the claims named
            check = by_id[contract_id] = ClaimCheck(contract_id, "lost")
            checks.append(check)
        if check.status == "pending":
            check.problems = []
        codes = dict.fromkeys(getattr(text, "code", HISTORY) for text in found)
        for code in codes:  # the history's own codes (a link, a malformed entry), else HISTORY
            check.lose(code, [text for text in found if getattr(text, "code", HISTORY) == code])


def _annotate(
    checks: list[ClaimCheck],
    runs_root: Path,
    contracts: ContractIndex,
    evidence: dict[str, EvidenceView | None],
    today_rules: Callable[[Path], list[str] | None] | None,
    *,
    strict_code: bool,
) -> None:
    """Supersedes chain, attempts, siblings, the rules the contract predates, and staleness (the code
    changed since the evidence; with `strict_code` a stale claim is lost)."""
    link_supersession(
        checks,
        {
            cid: raw["supersedes"]
            for cid, raw in contracts.raw.items()
            if isinstance(raw, dict) and isinstance(raw.get("supersedes"), str)
        },
        evidence,
    )
    annotate_siblings(checks, evidence)
    _flag_unlinked_successors(checks, runs_root, contracts, evidence)
    attempts, today = claim_attempts(runs_root), {}
    certs = check_certifications(runs_root)
    certified = certs.valid
    for check in checks:
        cid = check.contract_id
        tried = attempts.get(cid, [])
        check.attempts, check.earlier = len(tried), [a.line() for a in tried[:-1]]
        ev = evidence.get(cid)
        if today_rules is not None and cid in contracts:
            check.rule_flags = today_rules(Path(contracts[cid])) or []
        elif ev is not None and ev.rule_flags is not None:
            check.rule_flags = list(ev.rule_flags)
        if ev is None or ev.study is None:
            continue
        if ev.family is not None:
            check.family = describe_family(ev.family)
        if cid in certs.notes:
            check.add(CERTIFICATION_IGNORED, certs.notes[cid])
        cert = certified.get(cid)
        if cert is not None:
            check.certified = (
                f"{str(cert.time)[:10]}: {cert.reran} re-run under code "
                f"{str(cert.code_sha256)[:12]} reproduced the evidence"
                + _within(cert.tolerance)
                + _elsewhere(cert.reran_elsewhere)
                + (f" ({cert.reason})" if cert.reason else "")
            )
        found = staleness(ev, study_module(ev.study), today=today, certified=cert)
        check.stale, check.stale_files, check.stale_note = (
            found.stale,
            list(found.files),
            found.note,
        )
        # a standing claim only: a superseded one stands for nothing today, a withdrawn one is not "ok"
        standing = check.status in ("ok", "lost") and not check.superseded_by
        if strict_code and found.stale and standing:
            where = contracts[cid] if cid in contracts else f"contracts/{cid}.yaml"
            check.lose(
                STALE,
                [
                    f"stale (--strict-code): the code changed since its evidence: "
                    f"{describe_stale(check.stale_files)}"
                    + (f" ({found.note})" if found.note else "")
                    + f"; `gates certify {where} --reason TEXT` re-runs it under today's code"
                ],
            )


def _flag_unlinked_successors(
    checks: list[ClaimCheck],
    runs_root: Path,
    contracts: ContractIndex,
    evidence: dict[str, EvidenceView | None],
) -> None:
    """Lose each standing claim registered after the withdrawal of a claim with the same design (study,
    arms, kinds of conditions: `successor_problem`, the rule `gates run` and `gates check` refuse by)
    that does not name it in its supersedes chain; a pending contract is told so (`gates run` refuses
    it)."""
    entries = latest_entries(runs_root)
    if not any(is_withdrawn(e) for e in entries.values()):
        return
    for check in checks:
        if check.withdrawn:
            continue
        cid = check.contract_id
        design = design_of(evidence.get(cid)) or design_of(contracts.raw.get(cid))
        why = successor_problem(runs_root, cid, design, check.supersedes)
        if why is None:
            continue
        if check.status == "pending":
            check.add(UNLINKED_SUCCESSOR, why)
        else:
            check.lose(UNLINKED_SUCCESSOR, [why])


MAX_REPORT_BYTES = 16 * 1024 * 1024


def check_report(folder: Path, ev: Evidence) -> list[str]:
    """verdict.md is exactly the rendering of evidence.json."""
    path = folder / REPORT
    fix = f"`gates render {folder.name}` rewrites it from the evidence"
    try:
        text = read_capped(path, MAX_REPORT_BYTES).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as e:
        return [f"{path} cannot be read ({str(e).splitlines()[0]}); {fix}"]
    try:
        rendered = render_report(ev)
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        IndexError,
    ) as e:  # a shape the schema lets through
        return [
            f"{folder / EVIDENCE} cannot be rendered ({type(e).__name__}: {str(e)[:100]}); expected "
            f"evidence as `gates run` writes it"
        ]
    if text != rendered:
        return [
            f"{path} is not the rendering of its evidence.json (edited, or left by an interrupted write or an "
            f"older renderer); {fix}"
        ]
    return []


def _elsewhere(runs) -> str:
    """A certification's runs from other kernels, judged by the code the claim stood on."""
    if not runs:
        return ""
    commits = ", ".join(sorted({str(r.commit)[:12] for r in runs}))
    return f"; {len(runs)} more from other CPU kernels re-ran as the code of {commits} does here"


def _within(tolerance) -> str:
    if not isinstance(tolerance, dict):
        return ""
    return f" within abs {tolerance.get('abs'):g}, rel {tolerance.get('rel'):g}"
