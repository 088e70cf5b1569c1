"""`gates data`: fetch real text corpora into the cache, list them, verify them.

Registered in gates/cli/_app.py as the group `data`. Errors in the user's input
(an unknown corpus name) are raised as gates.errors.UserError, which `gates` prints as one line and
exits with 2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.table import Table

from gates.cli._group import command_group, group_console

if TYPE_CHECKING:
    from gates.models.corpora import FetchResult

data_app = command_group(
    "Real text corpora for studies: `gates data fetch NAME` downloads, verifies and extracts one into "
    "the cache ($TREEHEAP_GATES_CACHE, else ~/.cache/treeheap-gates) and prints its license; "
    "`gates data list` shows them. Studies name data as 'CORPUS:SIDE' (e.g. libreoffice-help:zh-en), "
    "a .txt/.tsv path, or 'moses:PATH_PREFIX:SRC:TGT'."
)
out = group_console()


def _size(n_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} B"


def _say(message: str) -> None:
    out.print(message, markup=False)


@data_app.command("fetch")
def fetch_command(
    name: str = typer.Argument(..., help="Registered corpus name (see `gates data list`)."),
    force: bool = typer.Option(
        False, "--force", help="Download and rebuild even if present and intact."
    ),
):
    """Download, extract and verify a corpus into the cache; prints its license and files.
    Does nothing (but verify) when the corpus is already present and intact."""
    fetch_and_describe(name, force=force)


def fetch_and_describe(name: str, force: bool = False, say=None) -> FetchResult:
    """Fetch corpus `name` (or verify it is present) and print what `gates data fetch` prints: where it
    is, its packages, its license and full text, its files and the sources studies name it by.
    `say` receives each line (default: stdout); `gates run --fetch` uses this too."""
    from gates.models import corpora as data

    say = say or _say
    result = data.fetch(name, force=force, progress=say)
    found = result.manifest
    if result.status == "already present":
        say(f"{name}: already present and verified (sha256 of every file) in {result.path}")
    else:
        say(f"{name}: fetched in {result.seconds:.1f} s into {result.path}")
    for package, version in found.get("packages", {}).items():
        say(f"  package {package} {version}")
    holders = "; ".join(found.get("copyright", []))
    say(f"license: {found['license']}{' - ' + holders if holders else ''}")
    say(f"  full text: {result.path / found.get('license_file', 'LICENSE.txt')}")
    spec = data.CORPORA[name]
    for filename, entry in found["files"].items():
        unit = "pairs" if filename in spec.pair_sides.values() else "lines"
        say(
            f"  {filename:<12} {_size(entry['bytes']):>9}  {entry['lines']:>7,} {unit}  sha256 {entry['sha256'][:16]}"
        )
    sources = [f"{name}:{side}" for side in [*spec.text_sides, *spec.pair_sides]]
    say(f"sources for studies: {', '.join(sources)}")
    return result


def corpora_to_fetch(config: dict, why: str | None) -> list[str]:
    """The registered corpora an arm needs that are not usable here: those its config names as a
    source ('NAME:SIDE', anywhere in the config) that are not present, and any its study's readiness
    message `why` asks to fetch (`gates data fetch NAME`)."""
    import re

    from gates.models import corpora as data

    named: set[str] = set()

    def walk(value) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, str):
            name, sep, _ = value.partition(":")
            if sep and name in data.CORPORA and not data.is_present(name):
                named.add(name)

    walk(config)
    if why:
        named |= {
            m for m in re.findall(r"gates data fetch ([A-Za-z0-9_.-]+)", why) if m in data.CORPORA
        }
    return sorted(named)


@data_app.command("list")
def list_command():
    """The registered corpora: license, whether present in the cache, size and path."""
    from gates.models import corpora as data

    table = Table()
    table.add_column("name", no_wrap=True)
    table.add_column("license", no_wrap=True)
    table.add_column("present")
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("path", overflow="fold")  # folded, never cut: the path is for copying
    rows = data.list_corpora()
    for row in rows:
        table.add_row(
            row["name"],
            row["license"],
            "yes" if row["present"] else "no",
            _size(row["size"]) if row["present"] else "-",
            row["path"],
        )
    out.print(table)
    for row in rows:
        _say(f"{row['name']}: {row['description']}")


@data_app.command("verify")
def verify_command(name: str = typer.Argument(..., help="Registered corpus name.")):
    """Recompute every file's sha256 against the corpus manifest; exit 1 if anything differs."""
    from gates.models import corpora as data

    problems = data.verify(name)
    for problem in problems:
        _say(problem)
    if problems:
        raise typer.Exit(1)
    _say(f"{name}: every file matches its sha256 in {data.corpus_path(name) / 'manifest.json'}")
