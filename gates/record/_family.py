"""A claim's family: its versions (the `supersedes` chain, recorded or withdrawn) share one alpha.

Testing each new version of a claim at full alpha is optional stopping: moving on to a version with
more seeds whenever one is inconclusive supports a false claim 8-12% of the time at alpha 0.05
(benchmarks/version_chains.py). So a family has one alpha, its first version's
`decision.family_alpha` (default: its `alpha`), and each recorded version spends the alpha its
verdict was tested at: version k is tested at min(its own alpha, what the versions before it left).
By the union bound over the versions, a false verdict anywhere in the family has probability at most
the family's alpha, whatever the rule for moving on. A version's seeds are the family's next ones
(never an earlier version's, tuning seeds included), so that what an earlier version saw cannot
steer what the next one tests; the platform derives them (`next_seed`), the user only counts them.

A version that was never recorded spent nothing (it tested nothing). Nothing is refunded: an earlier
version that came out invalid still had its chance to decide falsely.

The attempts of one version (`gates run --record --reason`: the same contract recorded again, after a
change of code) are re-tries too: attempt k is judged at the version's alpha up to what the family and
attempts 1..k-1 left, and a version spends what all its attempts spent (`_left_after`). One
exception: an attempt whose verdict was `invalid` (an arm it reads never completed, a control failed,
a bar beyond what the runs can reach) decided nothing and spends nothing, so the attempt that fixes
the bug is the design's first run as designed. (Its false-decision rate stays at the level as long as
whether an attempt runs as designed does not depend on how its claim's numbers fall; a version, a
new design chosen after seeing the data, gets no such refund.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gates.record._evidence import EVIDENCE, Evidence, FamilyRecord, read_evidence

# alphas are sums of a few declared decimals: compare them at this precision, not bit for bit
_EPS = 1e-12


@dataclass(frozen=True)
class Version:
    """An earlier version of a claim: its id, the alpha its recorded verdict spent (0 when it has no
    evidence) and the seeds it used (verdict and tuning)."""

    contract_id: str
    level: float
    seeds: tuple[int, ...] = ()
    recorded: bool = False
    attempts: int = 1  # recorded attempts (`level` is what they spent together)


INVALID = "invalid"  # a verdict that decided nothing: the attempt spends nothing


def _left_after(own_alpha: float, left: float, verdicts) -> float:
    """What a version's attempts (their verdicts, in order) leave of `left`: each is judged at its own
    alpha up to what the attempts before it left, and spends that, unless it was invalid."""
    for verdict in verdicts:
        if verdict != INVALID:
            level = min(own_alpha, left)
            left = 0.0 if left - level < _EPS else round(left - level, 12)
    return left


@dataclass(frozen=True)
class Family:
    """The family of one version: its first version's id (`root`), the family's alpha and the versions
    before this one (oldest first)."""

    root: str
    alpha: float
    earlier: tuple[Version, ...] = field(default=())
    # the verdicts of this version's attempts before the one judged (recorded again: they spent too)
    attempts_before: tuple[str | None, ...] = field(default=())

    @property
    def spent(self) -> float:
        return sum(v.level for v in self.earlier)

    @property
    def left(self) -> float:
        left = self.alpha - self.spent
        return 0.0 if left < _EPS else round(left, 12)

    @property
    def attempt(self) -> int:
        """Which attempt of this version is judged."""
        return len(self.attempts_before) + 1

    def left_by_attempts(self, own_alpha: float) -> float:
        """What this version's earlier attempts left of what its family left it."""
        return _left_after(own_alpha, self.left, self.attempts_before)

    def level(self, own_alpha: float) -> float:
        """The alpha this attempt of this version is tested at: its own, up to what its family and its
        earlier attempts left."""
        return min(own_alpha, self.left_by_attempts(own_alpha))

    def after_attempts(self, verdicts) -> Family:
        """This family, judging the attempt of this version that follows attempts with these verdicts."""
        return Family(self.root, self.alpha, self.earlier, tuple(verdicts))

    @property
    def next_seed(self) -> int:
        """The first seed no earlier version used: where this version's seeds start."""
        used = [s for v in self.earlier for s in v.seeds]
        return max(used) + 1 if used else 0

    def then(self, contract) -> Family:
        """The family a next version would have once `contract` (this version) is recorded: it spent
        what it is judged at and used its seeds."""
        own = contract.decision.alpha
        spent = self.left - self.left_by_attempts(own) + self.level(own)
        version = Version(contract.id, spent, _seeds(contract, None), True, self.attempt)
        return Family(self.root, self.alpha, (*self.earlier, version))

    def recorded(self, own_alpha: float) -> bool:
        """Whether a version's evidence records its family: when it has recorded earlier versions or
        its family's alpha is not its own (a first version that keeps alpha for later ones), or it is a
        later attempt (its earlier attempts spent)."""
        return any(v.recorded for v in self.earlier) or self.alpha != own_alpha or self.attempt > 1

    def as_record(self, own_alpha: float) -> dict:
        """What evidence records (`family`): enough to re-derive the level and to check it against the
        record of every earlier version."""
        return {
            "root": self.root,
            "alpha": self.alpha,
            "earlier": [
                {"contract_id": v.contract_id, "level": v.level} for v in self.earlier if v.recorded
            ],
            "level": self.level(own_alpha),
            **(
                {
                    "attempt": self.attempt,
                    "attempts_spent": round(self.left - self.left_by_attempts(own_alpha), 12),
                }
                if self.attempt > 1
                else {}
            ),
        }

    def describe(self, own_alpha: float) -> str:
        """One line for a verdict, verdict.md and status."""
        return _describe(
            self.root,
            self.alpha,
            self.earlier,
            self.attempt,
            self.left - self.left_by_attempts(own_alpha),
            self.level(own_alpha),
        )


def _describe(root, alpha, earlier, attempt: int, attempts_spent: float, level: float) -> str:
    spent = ", ".join(
        f"{v.contract_id} {v.level:g}" + (f" over {v.attempts} attempts" if v.attempts > 1 else "")
        for v in earlier
        if v.recorded
    )
    this = (
        f", attempt {attempt} (its attempts before spent {attempts_spent:g})" if attempt > 1 else ""
    )
    return (
        f"version {len(earlier) + 1} of claim family {root}{this}: family alpha {alpha:g}, spent "
        f"{sum(v.level for v in earlier):g} before it ({spent or 'nothing recorded'}), tested at alpha "
        f"{level:g}"
    )


def _contract(contracts_dir: Path | None, contract_id: str):
    """The contract `contract_id` in `contracts_dir` (its declarations only, no study), or None: its file
    is `<id>.yaml` by convention (`gates new` names it so), else any file there with that id."""
    from gates.contract import MAX_CONTRACT_BYTES, Contract, load_yaml

    if contracts_dir is None:
        return None
    folder = Path(contracts_dir)
    named = [folder / f"{contract_id}.yaml", folder / f"{contract_id}.yml"]
    others = sorted(set(folder.glob("*.yaml")) | set(folder.glob("*.yml")) - set(named))
    for path in named + others:
        try:
            data, _ = load_yaml(path, max_bytes=MAX_CONTRACT_BYTES)
            if not isinstance(data, dict) or data.get("id") != contract_id:
                continue
            return Contract.model_validate(data)
        except Exception:  # absent or broken: `gates verify` names it; the chain reads the evidence
            continue
    return None


def _evidence(runs_root: Path, contract_id: str) -> Evidence | None:
    try:
        return read_evidence(Path(runs_root) / contract_id / EVIDENCE)
    except (OSError, ValueError):
        return None


def _seeds(contract, ev: Evidence | None) -> tuple[int, ...]:
    if contract is not None:
        tuning = list(contract.tuning.seeds) if contract.tuning is not None else []
        return tuple(sorted(set(contract.seeds) | set(tuning)))
    return tuple(ev.settings.seeds) if ev is not None else ()


def family_of(
    contract, runs_root: Path, contracts_dir: Path | None = None, attempts_before=()
) -> Family:
    """The family of `contract` (a Contract) as the record stands, judging the attempt that follows
    attempts of it with the verdicts `attempts_before`: its `supersedes` chain followed through the
    contracts folder (else each version's evidence). Each recorded version spent, in order from the
    first, what each of its attempts was judged at (its own alpha up to what the versions and attempts
    before it left; an invalid attempt nothing); one never recorded spent nothing."""
    found: list[tuple[str, float, tuple[int, ...], bool, list]] = []  # newest first
    declared = contract.decision.family_alpha or contract.decision.alpha
    root, at, seen = contract.id, contract.supersedes, {contract.id}
    while at and at not in seen:
        seen.add(at)
        earlier, ev = _contract(contracts_dir, at), _evidence(runs_root, at)
        if earlier is None and ev is None:
            break  # a version the record does not hold spent nothing; the chain ends there
        decision = earlier.decision if earlier is not None else None
        own = float(decision.alpha if decision is not None else ev.settings.alpha)
        found.append((at, own, _seeds(earlier, ev), ev is not None, attempt_verdicts(ev)))
        root = at
        if decision is not None:
            declared, at = decision.family_alpha or decision.alpha, earlier.supersedes
        else:
            declared = ev.family.alpha if ev.family else ev.settings.alpha
            at = ev.supersedes
    family = Family(root=root, alpha=float(declared))
    for cid, own, seeds, recorded, verdicts in reversed(found):
        level = family.left - _left_after(own, family.left, verdicts) if recorded else 0.0
        version = Version(cid, round(level, 12), seeds, recorded, max(len(verdicts), 1))
        family = Family(family.root, family.alpha, (*family.earlier, version))
    return family.after_attempts(attempts_before)


def attempt_verdicts(ev: Evidence | None) -> list:
    """The verdicts of every attempt an evidence's version recorded, in order, its own the last."""
    if ev is None:
        return []
    earlier = [a.verdict for a in ev.attempt.earlier] if ev.attempt is not None else []
    return [*earlier, ev.verdict]


def family_for(loaded, runs_root: Path, attempts_before=None) -> Family:
    """The claim family a run or a re-derivation judges the verdict at: `loaded.family` where its
    caller found it (admission, with the family's refusals), else read from the record (`family_of`,
    the contracts folder being the contract's own), for the attempt after attempts with the verdicts
    `attempts_before` where given."""
    family = loaded.family or family_of(loaded.contract, runs_root, loaded.path.parent)
    return family.after_attempts(attempts_before) if attempts_before is not None else family


def family_record(loaded) -> dict | None:
    """What evidence records of a loaded contract's claim family (`loaded.family`), when it has one beyond
    itself: its earlier versions, the alpha each spent and the alpha this one is judged at."""
    family, own = loaded.family, loaded.contract.decision.alpha
    return family.as_record(own) if family is not None and family.recorded(own) else None


def describe_family(record: FamilyRecord | None) -> str | None:
    """`Family.describe` of a family as evidence records it, None when it records none."""
    if record is None:
        return None
    earlier = tuple(Version(v.contract_id, float(v.level), (), True) for v in record.earlier)
    return _describe(
        record.root,
        float(record.alpha),
        earlier,
        record.attempt,
        float(record.attempts_spent),
        float(record.level),
    )


def successors(runs_root: Path, contract_id: str) -> list[str]:
    """The recorded versions that supersede `contract_id` (their evidence says so)."""
    out = []
    for path in sorted(Path(runs_root).glob(f"*/{EVIDENCE}")):
        ev = _evidence(runs_root, path.parent.name)
        if ev is not None and ev.supersedes == contract_id and ev.contract_id != contract_id:
            out.append(ev.contract_id)
    return out


def _span(seeds) -> str:
    """Seeds as ranges: 0-9, 100-101."""
    seeds, parts = sorted(set(seeds)), []
    for s in seeds:
        if parts and s == parts[-1][1] + 1:
            parts[-1][1] = s
        else:
            parts.append([s, s])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts) or "none"


def family_errors(loaded, family: Family, runs_root: Path) -> list:
    """Why `loaded` (a contract not yet recorded) may not be recorded as a version of its family: an
    alpha above what its family left, seeds that are not the family's next ones (a first version's start
    at 0), a version beside another recorded successor of the same version (two branches would each
    spend the same alpha), or a version that a recorded version already supersedes."""
    c = loaded.contract
    errors = []
    own = c.decision.alpha
    spent = ", ".join(f"{v.contract_id} {v.level:g}" for v in family.earlier if v.recorded)
    if family.earlier and own > family.left:
        if family.left <= 0:
            msg = (
                f"its claim family ({family.root}) has no alpha left: the versions before it spent "
                f"{family.spent:g} of {family.alpha:g} ({spent}), so this version could neither support "
                f"nor refute; expected a new claim without `supersedes` if it asks a new question (the "
                f"family's record stays beside it)"
            )
        else:
            msg = (
                f"alpha {own:g} is more than its claim family ({family.root}) has left: {family.left:g} "
                f"of {family.alpha:g} (spent: {spent}); expected decision.alpha <= {family.left:g}"
            )
        errors.append(loaded.error(("decision", "alpha"), msg))
    start, n = family.next_seed, len(c.seeds)
    if list(c.seeds) != list(range(start, start + n)):
        used = [s for v in family.earlier for s in v.seeds]
        why = (
            f"the versions before it used seeds {_span(used)}, and a version's seeds are fresh so that "
            f"what earlier versions showed cannot steer what it tests"
            if family.earlier
            else "a first version's seeds start at 0, so no start is chosen after a look at the data"
        )
        form = f"seeds: {n}" if start == 0 else f"seeds: {{count: {n}, start: {start}}}"
        errors.append(
            loaded.error(
                ("seeds",),
                f"seeds {_span(c.seeds)} are not the family's next {n}: {why}; expected {form}",
            )
        )
    if c.supersedes:
        others = [s for s in successors(runs_root, c.supersedes) if s != c.id]
        if others:
            errors.append(
                loaded.error(
                    ("supersedes",),
                    f"{c.supersedes} is already superseded by recorded {', '.join(others)}: a claim "
                    f"family is one chain; expected supersedes: {others[-1]} (its latest version)",
                )
            )
    later = successors(runs_root, c.id)
    if later:
        errors.append(
            loaded.error(
                ("id",),
                f"{', '.join(later)} already supersede{'s' if len(later) == 1 else ''} {c.id} on the "
                f"record and spent its family's alpha as if {c.id} had spent none; expected this "
                f"version left unrecorded (its successor stands for it)",
            )
        )
    return errors
