"""The claims board: which claims the index lists, in which order, and which it folds.

A query string says it (a GET form submits one, so it works without scripts): `q` words that must all
appear in a claim's id or text, `verdict`, `study`, `flag` (repeatable: every one named must apply)
and `sort`. Values the board does not know are ignored, never an error page. Superseded versions are
folded under the newest version of their chain when that version is listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlencode

from gates.dashboard.data import Claim

VERDICTS = ("supported", "refuted", "inconclusive", "invalid", "pending", "withdrawn")
# flag -> what it means, as the board's form says it
FLAGS = {
    "stale": "stale (code changed)",
    "withdrawn": "withdrawn",
    "superseded": "superseded",
    "lost": "lost (check failed)",
    "certified": "certified",
}
SORTS = {"id": "contract id", "date": "newest first", "verdict": "verdict, then newest"}
MAX_TEXT = 200  # characters of a search kept


def shown_verdict(c: Claim) -> str:
    return "withdrawn" if c.withdrawn else (c.verdict or "pending")


def flags_of(c: Claim) -> list[str]:
    """The board's flags that apply to a claim."""
    found = {
        "stale": c.stale,
        "withdrawn": c.withdrawn,
        "superseded": bool(c.superseded_by),
        "lost": c.check == "lost",
        "certified": bool(c.certified),
    }
    return [f for f in FLAGS if found[f]]


@dataclass(frozen=True)
class BoardQuery:
    text: str = ""
    verdict: str = ""
    study: str = ""
    flags: tuple[str, ...] = ()
    sort: str = "id"

    @classmethod
    def parse(cls, query: str) -> BoardQuery:
        """The board's query from a URL's query string (unknown fields and values dropped)."""
        try:
            params = parse_qs(query or "", max_num_fields=64)
        except ValueError:  # more fields than any form of the board sends
            return cls()

        def one(name: str) -> str:
            return (params.get(name) or [""])[0].strip()

        verdict, sort = one("verdict"), one("sort")
        return cls(
            text=" ".join(one("q").split())[:MAX_TEXT],
            verdict=verdict if verdict in VERDICTS else "",
            study=one("study")[:MAX_TEXT],
            flags=tuple(f for f in FLAGS if f in params.get("flag", [])),
            sort=sort if sort in SORTS else "id",
        )

    @property
    def narrows(self) -> bool:
        return bool(self.text or self.verdict or self.study or self.flags)

    def matches(self, c: Claim) -> bool:
        haystack = f"{c.contract_id} {c.claim}".lower()
        return (
            all(word in haystack for word in self.text.lower().split())
            and (not self.verdict or shown_verdict(c) == self.verdict)
            and (not self.study or c.study == self.study)
            and set(self.flags) <= set(flags_of(c))
        )

    def url(self, base: str, **change) -> str:
        """`base` with this query, `change` applied (for links that keep the other fields)."""
        fields = {
            "q": self.text,
            "verdict": self.verdict,
            "study": self.study,
            "flag": list(self.flags),
            "sort": self.sort if self.sort != "id" else "",
            **change,
        }
        kept = {k: v for k, v in fields.items() if v}
        return f"{base}?{urlencode(kept, doseq=True)}" if kept else base


@dataclass
class Entry:
    """A row of the board, with the superseded versions folded under it (newest first)."""

    claim: Claim
    folded: list[Claim] = field(default_factory=list)


def _newest(c: Claim, by_id: dict[str, Claim]) -> tuple[Claim, int]:
    """The newest version of c's supersedes chain, and how many versions back c is from it."""
    at, depth, seen = c, 0, {c.contract_id}
    while at.superseded_by:
        successor = by_id.get(at.superseded_by[0])
        if successor is None or successor.contract_id in seen:
            break
        seen.add(successor.contract_id)
        at, depth = successor, depth + 1
    return at, depth


def _date(c: Claim) -> str:
    return c.created_at or ""


def select(claims: list[Claim], query: BoardQuery) -> list[Entry]:
    """The rows the board shows for a query, sorted, superseded versions folded under the newest
    version of their chain where that one is shown too (else they stand as rows of their own)."""
    by_id = {c.contract_id: c for c in claims}
    chosen = [c for c in claims if query.matches(c)]
    # stable sorts, last key first: ties keep the id order; a pending claim (no date) sorts last
    chosen.sort(key=lambda c: c.contract_id)
    if query.sort in ("date", "verdict"):
        chosen.sort(key=_date, reverse=True)
    if query.sort == "verdict":
        chosen.sort(key=lambda c: VERDICTS.index(shown_verdict(c)))
    shown = {c.contract_id for c in chosen}
    folded: dict[str, list[tuple[int, Claim]]] = {}
    for c in chosen:
        head, depth = _newest(c, by_id)
        if depth and head.contract_id in shown:
            folded.setdefault(head.contract_id, []).append((depth, c))
    under = {c.contract_id for versions in folded.values() for _, c in versions}
    return [
        Entry(c, [v for _, v in sorted(folded.get(c.contract_id, []), key=lambda x: x[0])])
        for c in chosen
        if c.contract_id not in under
    ]
