"""Certifications in the claims history: a `certified` entry (`gates certify`) says re-runs of a
claim's recorded runs under later code reproduced them; `check_certifications` checks each claim's
standing one (its re-run values against the evidence, its code fingerprint against the commit that
added it), and staleness is then measured from its code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from gates.errors import Problem
from gates.record._evidence import Evidence, read_evidence
from gates.record._index import (
    EVIDENCE,
    INDEX,
    IndexEntry,
    brief,
    index_path,
    parse_index,
    tolerance_problem,
)
from gates.record._provenance import git

# a certified entry that vouches for re-runs the evidence contradicts, or for code that was not the
# code committed with it
CERTIFICATION_INVALID = "certification_invalid"
# a note, not a loss: a certified entry in the format before re-run values were recorded, added
# after that format ended (or where git cannot say when): not counted, the claim is measured from
# the code its evidence recorded
CERTIFICATION_IGNORED = "certification_ignored"

# Certified entries before issue #39 carried no re-run values (`reran_runs`): such an entry counts only
# when the commit that added it is this one or an ancestor (the last commit whose `gates certify` wrote
# that format); added later, or where git cannot say when, it is not counted (CERTIFICATION_IGNORED).
LEGACY_CERTIFIED_UNTIL = "f1c68bcbd1eef13ad8616d691421631dad1b91c3"


def within_tolerance(a, b, abs_tol: float, rel_tol: float) -> bool:
    """A re-run value `a` against the recorded `b` (None: not finite, as evidence stores it)."""
    if a is None or b is None:
        return a is None and b is None
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b or (math.isnan(a) and math.isnan(b))
    return abs(a - b) <= abs_tol + rel_tol * abs(b)


@dataclass
class Certifications:
    """What the claims history's certified entries establish (`check_certifications`): `valid`
    (contract id -> its latest certified entry that still concerns its evidence and holds: staleness
    is measured from its code), `problems` ((contract id, Problem) for entries that do not hold: the
    claim is lost) and `notes` (contract id -> why an entry was not counted)."""

    valid: dict[str, IndexEntry]
    problems: list[tuple[str, Problem]]
    notes: dict[str, str]


def certifications(runs_root: Path) -> dict[str, IndexEntry]:
    """contract id -> its latest `certified` entry that still concerns its evidence (no attempt
    recorded since: a new attempt's evidence is measured against the code that computed it) and holds
    (`check_certifications`)."""
    return check_certifications(runs_root).valid


def check_certifications(
    runs_root: Path, entries: list[IndexEntry] | None = None
) -> Certifications:
    """Check each claim's standing certified entry: a certification is what only a re-run produces,
    so it carries the re-runs' values (`reran_runs`), which must be the recorded runs' within the
    entry's tolerance, and its code fingerprint, which must be the code of the commit that added it
    (where the claims history and the code are one repository and the study's code is in it). An
    entry from before re-run values were recorded counts only when committed by LEGACY_CERTIFIED_UNTIL
    (or an ancestor); a malformed entry never counts (`entry_problems` names it)."""
    runs_root = Path(runs_root)
    if entries is None:
        entries = parse_index(runs_root)[0]
    standing: dict[str, IndexEntry] = {}
    for e in entries:
        cid = e.contract_id
        if cid is None:
            continue
        if e.kind == "certified" and not e.malformed:
            standing[cid] = e
        elif e.is_attempt:
            standing.pop(cid, None)
    found = Certifications({}, [], {})
    if not standing:
        return found
    commits = _line_commits(runs_root)
    for cid, e in standing.items():
        line = e.line
        said = f"{INDEX} line {line} (certified {str(e.time)[:10]})"
        commit = commits.get(line) if commits is not None else None
        if e.reran_runs is None:  # absent: a malformed one never gets here
            if commit and _is_ancestor(runs_root, commit, LEGACY_CERTIFIED_UNTIL):
                found.valid[cid] = e
            else:
                when = (
                    "git cannot say when it was added"
                    if commit is None
                    else "it is not committed"
                    if not commit
                    else f"it was added in commit {commit[:12]}"
                )
                found.notes[cid] = (
                    f"{said} is not counted: it records no re-run values (the format before "
                    f"certifications carried them) and {when}; `gates certify` records a new one"
                )
            continue
        why = _reran_problem(runs_root, cid, e) or _code_problem(runs_root, e, commit)
        if why:
            found.problems.append((cid, Problem(CERTIFICATION_INVALID, f"{said}: {why}")))
        else:
            found.valid[cid] = e
    return found


def standing_code(runs_root: Path, contract_id: str, evidence: Evidence) -> tuple[str, str] | str:
    """(commit, code sha256) of the code a claim stands on: that of its standing certification, with
    the commit that added it, else the code its evidence recorded, with the commit it was recorded
    at; each only where that commit of the code's repository (PROJECT_ROOT) holds files that hash to
    that code (`files_at_commit`). Otherwise why there is none (a certification not committed, or in
    a claims history outside the code's repository; evidence from uncommitted changes; a study whose
    code is not in this repository's history; no git): a string."""
    from gates.record._provenance import PROJECT_ROOT, files_at_commit, plugin_files
    from gates.study import study_module

    module = study_module(evidence.study) if evidence.study is not None else None
    if module is None:
        return f"study {evidence.study!r} is not registered here"
    if plugin_files(module) is not None:
        return f"the code of study {evidence.study!r} is not in this repository's history"
    entry = certifications(runs_root).get(contract_id)
    if entry is not None:
        top = git("rev-parse", "--show-toplevel", root=index_path(runs_root).absolute().parent)
        if not top or Path(top).resolve() != PROJECT_ROOT.resolve():
            return "its certification is not in the history of the code's repository"
        commit = (_line_commits(runs_root) or {}).get(entry.line)
        code, what = entry.code_sha256, "its certification"
    else:
        commit, code, what = evidence.git_commit, evidence.code_sha256, "its evidence"
    if not commit:
        return f"{what} is not committed"
    at = files_at_commit(commit, module, PROJECT_ROOT)
    if at is None:
        return f"commit {commit[:12]} of {what} is not in this repository"
    if at[0] != code:
        return (
            f"the files of commit {commit[:12]} do not hash to the code of {what} "
            f"({str(code)[:12]}): it was computed with changes that were never committed"
        )
    return commit, str(code)


def _reran_problem(runs_root: Path, cid: str, entry: IndexEntry) -> str | None:
    """Why the entry's re-run values are not the recorded runs' within its tolerance, or None."""
    why = tolerance_problem(entry.tolerance)
    if why:
        return f"{why} (a certification records the tolerance it compared with)"
    ev = _evidence(runs_root, cid)
    if ev is None:
        return None  # the evidence's own check says what is wrong with it
    recorded = {(r.arm, r.seed): r.metrics for r in ev.runs if r.status == "completed"}
    tol, seen = entry.tolerance, set()
    for run in entry.reran_runs:
        key, name = (run.arm, run.seed), f"{run.arm}/seed {run.seed}"
        if key in seen:
            return f"re-run {name} is listed twice"
        seen.add(key)
        if key not in recorded:
            return f"re-run {name} is no completed run of the evidence"
        metrics = recorded[key]
        if not run.metrics:
            return f"re-run {name} records no metric"
        for metric, value in run.metrics.items():
            was = metrics.get(metric)
            if not within_tolerance(value, was, tol["abs"], tol["rel"]):
                return (
                    f"re-run {name}: {metric} {value} is not the recorded {brief(was)} within "
                    f"abs {tol['abs']:g}, rel {tol['rel']:g}: the entry vouches for re-runs the "
                    f"evidence contradicts"
                )
    if entry.reran != f"{len(seen)} of {len(recorded)} completed runs":
        return (
            f"reran says {brief(entry.reran)}, its re-run values are {len(seen)} of "
            f"{len(recorded)} completed runs"
        )
    return None


def _code_problem(runs_root: Path, entry: IndexEntry, commit: str | None) -> str | None:
    """Why the entry's code fingerprint is not the code of the commit that added it, or None (also
    when that cannot be told: not committed yet, no git, a study whose code is not in the repository
    of the claims history)."""
    from gates.record._provenance import files_at_commit, plugin_files
    from gates.study import study_module

    if not commit:
        return None
    ev = _evidence(runs_root, str(entry.contract_id))
    module = study_module(ev.study) if ev is not None and ev.study is not None else None
    top = git("rev-parse", "--show-toplevel", root=index_path(runs_root).absolute().parent)
    if module is None or not top or plugin_files(module) is not None:
        return None
    if not (Path(top) / "gates").is_dir():  # the platform's code is elsewhere: not this history's
        return None
    at = files_at_commit(commit, module, Path(top))
    if at is None or at[0] == entry.code_sha256:
        return None
    return (
        f"its code fingerprint {str(entry.code_sha256)[:12]} is not the code of commit "
        f"{commit[:12]}, which added it ({at[0][:12]}): a certification is committed with the code "
        f"it was made under"
    )


def _evidence(runs_root: Path, cid: str) -> Evidence | None:
    """The claim's evidence as read, or None where it does not read: the claim's own check loses it,
    and a certification is not judged against evidence that is not there."""
    try:
        return read_evidence(Path(runs_root) / cid / EVIDENCE)
    except ValueError:
        return None


def _line_commits(runs_root: Path) -> dict[int, str] | None:
    """line number of the claims history -> the commit that added it ("" for a line not committed
    yet), from `git blame`; None outside a git checkout (or where git cannot tell)."""
    folder = index_path(runs_root).absolute().parent
    if not folder.is_dir() or not git("rev-parse", "--show-toplevel", root=folder):
        return None
    blamed = git("blame", "--porcelain", "--", INDEX, root=folder)
    if blamed is None:
        return {}  # never committed: every line is new
    out = {}
    for row in blamed.splitlines():
        parts = row.split(" ")
        if len(parts) >= 3 and len(parts[0]) == 40 and parts[2].isdigit():
            out[int(parts[2])] = "" if set(parts[0]) == {"0"} else parts[0]
    return out


def _is_ancestor(runs_root: Path, commit: str, of: str) -> bool:
    folder = index_path(runs_root).absolute().parent
    return git("merge-base", "--is-ancestor", commit, of, root=folder) is not None
