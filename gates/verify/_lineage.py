"""The claims history across git commits: it only grows.

`runs/INDEX.jsonl` is a hash chain, and anyone can recompute a hash chain: edit an entry and re-chain
every `prev`, or delete the file and backfill it anew, and the file alone looks whole. What a forger
cannot recompute is the repository's history of that file. `check_lineage` reads the index at every
commit that changed it and checks that each parent's index is a prefix of its child's (lines are only
appended), and that the working copy extends the committed one. A line rewritten, removed or
reordered in any commit, or the file deleted or regenerated, loses the claims its lines concern.

What this proves, and what not (docs/verify.md, "Threat model"): with the full git history, every
verdict ever indexed stays on the record as first written, so a claim cannot be quietly re-recorded,
un-withdrawn or moved; it cannot see a forger who rewrites git history itself (a force-push; that is
for the hosting's branch protection), nor evidence forged before its first entry was committed (that
is what audits re-run). A shallow clone, a checkout without git or an index never committed cannot be
checked: `notes` says what was not.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gates.errors import Problem
from gates.record import (
    HISTORY_NOT_A_FILE,
    INDEX,
    IndexEntry,
    git,
    index_location_problem,
    index_path,
    parse_json,
)

GIT_TIMEOUT_S = 60


@dataclass(frozen=True)
class Lineage:
    """What `check_lineage` found: problems by contract id, and what it could not check."""

    problems: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    commits: int = 0  # commits whose index was compared with their parents'


def check_lineage(runs_root: Path) -> Lineage:
    """Check that runs_root/INDEX.jsonl only grew across the commits of the repository it is in."""
    path = index_path(Path(runs_root)).absolute()
    # asked from the folder above the runs folder: the runs folder may be a link to elsewhere
    above = path.parent.parent
    top = git("rev-parse", "--show-toplevel", root=above if above.is_dir() else None)
    if not top:
        return Lineage(
            notes=[f"{INDEX}: not in a git checkout; its growth across commits is not checked"]
        )
    top = Path(top)
    linked = index_location_problem(Path(runs_root))
    try:
        # never resolved through a link (a linked file or folder is linked's problem): the path in
        # the repository, whose committed versions are compared
        rel = _lexical(path, top)
    except ValueError:
        return Lineage(
            notes=[f"{path} is outside the git checkout {top}; not checked across commits"]
        )
    changed = (git("log", "--format=%H %P", "--full-history", "--", rel, root=top) or "").split(
        "\n"
    )
    changed = [line.split() for line in changed if line.strip()]
    if not changed:
        return Lineage(
            notes=[f"{rel} was never committed: its growth across commits is not checked"]
        )
    wanted = {f"{c}:{rel}" for commit, *parents in changed for c in (commit, *parents)}
    wanted.add(f"HEAD:{rel}")
    blobs = _blobs(top, sorted(wanted))
    problems: dict[str, list[str]] = {}
    notes = []
    shallow = False
    for commit, *parents in changed:
        child = blobs.get(f"{commit}:{rel}")
        for parent in parents:
            key = f"{parent}:{rel}"
            if key not in blobs:  # beyond a shallow clone's boundary (or the file was absent)
                shallow = shallow or _missing_commit(top, parent)
                continue
            before = blobs[key]
            if before is None:
                continue  # the file did not exist at the parent
            where = f"commit {commit[:12]} ({_subject(top, commit)})"
            _compare(before, child, where, rel, problems)
    head = blobs.get(f"HEAD:{rel}")
    if linked:  # never followed: the claims of the committed history are lost, whatever it names
        ids = set()
        for blob in blobs.values():  # every committed version (a link committed in place: its text)
            ids |= _ids((blob or b"").splitlines())
        for cid in sorted(ids) or ["(index)"]:
            _add(problems, cid, Problem(HISTORY_NOT_A_FILE, linked))
    elif head is not None:
        try:
            now = path.read_bytes() if path.is_file() else None
        except OSError:
            now = None
        _compare(head, now, "the working copy", rel, problems)
    together = _verifier_changed_with_claims(top, rel)
    if together:
        notes.append(together)
    if shallow or git("rev-parse", "--is-shallow-repository", root=top) == "true":
        oldest = git("log", "--reverse", "--format=%h %cs", "--max-parents=0", "HEAD", root=top)
        notes.append(
            f"{rel}: a shallow clone; its growth is checked only from the oldest commit here "
            f"({(oldest or '?').splitlines()[0]}); `git fetch --unshallow` to check it from the start"
        )
    return Lineage(problems, notes, len(changed))


PLATFORM = "gates"  # the verifier's own code, where the repository holds it (this one does)


def _verifier_changed_with_claims(top: Path, rel: str) -> str | None:
    """A note naming each commit (and the working copy) that changed the platform's code (gates/)
    together with the claims history: CI runs the verifier of the commit it checks, so a commit that
    records claims and changes the verifier at once is checked by a verifier it wrote. The docs' threat
    model says what closes that (a verifier from outside the repository); this makes such commits
    visible for review. None when there are none, or the repository does not hold gates/."""
    if not (top / PLATFORM).is_dir():
        return None
    log = git(
        "log", "--format=@%H %s", "--name-only", "--full-history", "--", rel, PLATFORM, root=top
    )
    found, commit, names = [], None, set()

    def close() -> None:
        if commit and rel in names and any(n.startswith(f"{PLATFORM}/") for n in names):
            found.append(commit)

    for row in (log or "").splitlines():
        if row.startswith("@"):
            close()
            commit, names = row[1:], set()
        elif row.strip():
            names.add(row.strip())
    close()
    dirty = git("status", "--porcelain", "--", rel, PLATFORM, root=top) or ""
    changed = {row[3:].strip() for row in dirty.splitlines() if len(row) > 3}
    if rel in changed and any(n.startswith(f"{PLATFORM}/") for n in changed):
        found.insert(0, "the working copy")
    if not found:
        return None
    shown = [
        c if c == "the working copy" else f"{c[:12]} ({json.dumps(c[41:][:50])[1:-1]})"
        for c in found[:5]
    ]
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    return (
        f"{len(found)} commit{'s' * (len(found) > 1)} changed {PLATFORM}/ together with {rel}: "
        f"{', '.join(shown)}{more}; the verifier that checked each is its own: review its "
        f"{PLATFORM}/ changes apart from its claims (docs/verify.md, threat model)"
    )


def _lexical(path: Path, top: Path) -> str:
    """`path` (runs/INDEX.jsonl) relative to the checkout `top`, resolving the folders above its runs
    folder but neither the runs folder nor the file (either may be a link: never followed); ValueError
    when it is not under `top`."""
    above = Path(os.path.realpath(path.parent.parent))
    return (above / path.parent.name / path.name).relative_to(top.resolve()).as_posix()


def _compare(before: bytes, after: bytes | None, where: str, rel: str, problems: dict) -> None:
    """Problems (by contract id) where `after` does not extend `before` line by line."""
    if after is None:
        for cid in _ids(before.splitlines()) or ["(index)"]:
            _add(problems, cid, f"{rel} was deleted in {where}: the claims history only grows")
        return
    if after.startswith(before):
        return
    old, new = before.splitlines(), after.splitlines()
    line = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    what = "rewritten" if line < len(new) else "removed"
    ids = _ids(old[line : line + 1]) | _ids(new[line : line + 1])
    if line >= len(new):  # lines cut off the end: every claim they concerned
        ids |= _ids(old[line:])
    for cid in sorted(ids) or ["(index)"]:
        _add(
            problems,
            cid,
            f"{rel} line {line + 1} and after were {what} in {where}: committed entries are never "
            f"changed (the claims history only grows; `git log -p -- {rel}` shows the change)",
        )


def _ids(lines: list[bytes]) -> set[str]:
    out = set()
    for raw in lines:
        try:
            entry = parse_json(raw)
        except ValueError:
            continue
        cid = IndexEntry.from_json(entry, 0).contract_id if isinstance(entry, dict) else None
        if cid is not None:
            out.add(cid)
    return out


def _add(problems: dict, cid: str, text: str) -> None:
    if text not in problems.setdefault(cid, []):
        problems[cid].append(text)


def _blobs(top: Path, names: list[str]) -> dict[str, bytes | None]:
    """name ("<commit>:<path>") -> its bytes, None where the path does not exist at that commit;
    names whose commit is not in this clone (beyond a shallow boundary) are left out."""
    try:
        done = subprocess.run(
            ["git", "cat-file", "--batch"],
            cwd=top,
            input="".join(f"{n}\n" for n in names).encode(),
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    if done.returncode != 0:
        return {}
    out, data, at = {}, done.stdout, 0
    for name in names:
        end = data.index(b"\n", at)
        header = data[at:end].split()
        at = end + 1
        if header[-1] == b"missing":
            if _has_commit(top, name.split(":", 1)[0]):
                out[name] = None  # the commit is here, the file was not
            continue
        size = int(header[2])
        out[name] = data[at : at + size]
        at += size + 1
    return out


def _has_commit(top: Path, commit: str) -> bool:
    return git("cat-file", "-e", f"{commit}^{{commit}}", root=top) is not None


def _missing_commit(top: Path, commit: str) -> bool:
    return not _has_commit(top, commit)


def _subject(top: Path, commit: str) -> str:
    subject = git("log", "-1", "--format=%s", commit, root=top) or ""
    return json.dumps(subject[:60])[1:-1] + ("..." if len(subject) > 60 else "")
