"""Real text corpora, fetched reproducibly into a cache, and users' own text files.

A registered corpus is fetched once with `gates data fetch NAME` into
`<cache>/corpora/<name>/` (`<cache>` is `$TREEHEAP_GATES_CACHE`, else `~/.cache/treeheap-gates`).
Every output file is written atomically and `manifest.json` is written last: the manifest is the
commit point, recording each file's sha256, size and line count. A corpus is *present* when its
manifest exists, was written by the current build format and every file it lists exists with the
recorded size; `verify()` (and `fetch()`) recompute the hashes, and every `load_*` checks the hash
of the bytes it reads, so a tampered or truncated file is never used silently.

Studies name their data with a *source* string:

- `"libreoffice-help:en"` (also `:zh`, `:de`): monolingual lines of a registered corpus;
- `"libreoffice-help:zh-en"`, `"libreoffice-help:de-en"`: aligned (source, target) pairs;
- a path to a user's file: `.tsv` (`source<TAB>target`; as text, its first column) or any other
  file read as one text per line (`.txt`, `train.de`, ...);
- `"moses:PATH_PREFIX:SRC:TGT"`: Moses-style parallel files `PATH_PREFIX.SRC` / `PATH_PREFIX.TGT`.

This module must never import torch: `gates` stays importable without it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from gates.errors import UserError, did_you_mean

Progress = Callable[[str], None]

# Bumped whenever the extraction of a corpus changes what it writes; a corpus built by another
# format is reported as missing (and rebuilt by a plain `fetch`), so no study mixes two extractions.
BUILD_FORMAT = 1


class CorpusMissing(Exception):
    """A registered corpus is not fetched (or not usable); the message says the command to run."""


class CorpusCorrupt(CorpusMissing):
    """A fetched corpus no longer matches its manifest (a file was edited, truncated or removed)."""


# --------------------------------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class CorpusSpec:
    """A corpus that `fetch` knows how to obtain.

    It is fetched by downloading `debian_packages` with `apt-get download` (never installed),
    unpacking them with `dpkg -x` into one folder and calling `build(extracted_root, out_dir, ...)`,
    which writes the output files and the manifest.
    """

    name: str
    description: str
    license: str
    debian_packages: tuple[str, ...]
    build: Callable[..., dict]
    # side -> (file, column): column None means the whole line, 0 the first TSV column
    text_sides: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    # side -> TSV file with source<TAB>target
    pair_sides: dict[str, str] = field(default_factory=dict)

    def fetch_command(self) -> str:
        return f"gates data fetch {self.name}"


# --------------------------------------------------------------------------------------------------
# Cache layout


def cache_root() -> Path:
    configured = os.environ.get("TREEHEAP_GATES_CACHE")
    return (
        Path(configured).expanduser() if configured else Path.home() / ".cache" / "treeheap-gates"
    )


def corpus_path(name: str) -> Path:
    """Where corpus `name` lives (or would live); does not check that it is there."""
    return cache_root() / "corpora" / name


def _spec(name: str) -> CorpusSpec:
    try:
        return CORPORA[name]
    except KeyError:
        known = ", ".join(sorted(CORPORA))
        raise UserError(
            f"unknown corpus {name!r}{did_you_mean(name, CORPORA)}; known corpora: {known}"
        ) from None


# --------------------------------------------------------------------------------------------------
# Files: atomic writes, hashes, manifest


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_atomically(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then os.replace: readers see old or new, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(
            fd, 0o644
        )  # mkstemp makes 0600; a shared cache must be readable like any data file
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _file_entry(data: bytes) -> dict:
    return {
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "lines": data.count(b"\n"),
    }


def _tsv_field(text: str) -> str:
    """A TSV cell: tabs and line breaks would break the one-pair-per-line format, so they become spaces."""
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def _lines_bytes(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8")


def write_corpus(out_dir: Path, files: dict[str, bytes], meta: dict) -> dict:
    """Write `files` and then `manifest.json` (the commit point) into out_dir; return the manifest.

    The old manifest is removed first, so a crash half-way leaves a corpus that is *missing*, never
    one whose manifest describes files it does not have.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (out_dir / "manifest.json").unlink()
    entries = {}
    for filename, data in files.items():
        _write_atomically(out_dir / filename, data)
        entries[filename] = _file_entry(data)
    manifest_data = {
        **meta,
        "build_format": BUILD_FORMAT,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "files": entries,
    }
    _write_atomically(
        out_dir / "manifest.json",
        (json.dumps(manifest_data, indent=2, ensure_ascii=False) + "\n").encode("utf-8"),
    )
    return manifest_data


def _read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def _presence_problem(name: str) -> str | None:
    """Why corpus `name` is not usable, by a cheap check (manifest, format, files and sizes), or None."""
    folder = corpus_path(name)
    found = _read_manifest(folder)
    fetch = f"run: gates data fetch {name}"
    if found is None:
        return f"corpus {name!r} is not fetched; {fetch}"
    if found.get("build_format") != BUILD_FORMAT:
        return (
            f"corpus {name!r} was built by another version of gates (format {found.get('build_format')}, "
            f"this one reads {BUILD_FORMAT}); {fetch}"
        )
    for filename, entry in found.get("files", {}).items():
        path = folder / filename
        if not path.is_file():
            return f"corpus {name!r} is incomplete: {filename} is missing; {fetch} --force"
        if path.stat().st_size != entry["bytes"]:
            return f"corpus {name!r} is damaged: {filename} does not match its manifest; {fetch} --force"
    return None


def verify(name: str) -> list[str]:
    """Recompute every file's sha256 against the manifest; the problems found (empty when intact)."""
    _spec(name)
    problem = _presence_problem(name)
    if problem:
        return [problem]
    folder = corpus_path(name)
    problems = []
    for filename, entry in _read_manifest(folder)["files"].items():
        if _sha256_file(folder / filename) != entry["sha256"]:
            problems.append(
                f"corpus {name!r}: {filename} does not match its sha256 in manifest.json "
                f"(edited or damaged); run: gates data fetch {name} --force"
            )
    return problems


def is_present(name: str) -> bool:
    """Cheap presence check (manifest, format, files with their recorded sizes); `verify` hashes."""
    return _presence_problem(name) is None


def corpus_dir(name: str) -> Path:
    """The folder of a fetched corpus; raises CorpusMissing (with the command to run) otherwise."""
    _spec(name)
    problem = _presence_problem(name)
    if problem:
        raise CorpusMissing(problem)
    return corpus_path(name)


def manifest(name: str) -> dict:
    return _read_manifest(corpus_dir(name))


def _read_corpus_file(name: str, filename: str) -> str:
    """A corpus file's text, checked against its manifest hash on the bytes actually read (cheap:
    hashing ~10 MB takes milliseconds), so a study never trains on silently edited data."""
    folder = corpus_dir(name)
    data = (folder / filename).read_bytes()
    expected = _read_manifest(folder)["files"][filename]["sha256"]
    if hashlib.sha256(data).hexdigest() != expected:
        raise CorpusCorrupt(
            f"corpus {name!r}: {filename} does not match its sha256 in manifest.json "
            f"(edited or damaged); run: gates data fetch {name} --force"
        )
    return data.decode("utf-8")


# --------------------------------------------------------------------------------------------------
# Fetching


@dataclass
class FetchResult:
    name: str
    status: str  # "fetched" or "already present"
    path: Path
    manifest: dict
    seconds: float


@contextlib.contextmanager
def _corpus_lock(name: str) -> Iterator[None]:
    """One fetch of a corpus at a time (two shells running `gates data fetch` would interleave writes)."""
    import fcntl

    lock_dir = cache_root() / "corpora"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fetch(name: str, force: bool = False, progress: Progress | None = None) -> FetchResult:
    """Obtain corpus `name` into the cache; returns at once ("already present") when it is there and
    every file matches its sha256, unless `force`."""
    say = progress or (lambda _msg: None)
    spec = _spec(name)
    started = time.monotonic()
    out_dir = corpus_path(name)
    with _corpus_lock(name):
        if not force:
            problems = verify(name)
            if not problems:
                return FetchResult(
                    name,
                    "already present",
                    out_dir,
                    _read_manifest(out_dir),
                    time.monotonic() - started,
                )
            if (out_dir / "manifest.json").exists():
                say(f"refetching: {problems[0]}")
        cache_root().mkdir(parents=True, exist_ok=True)
        # The work folder sits in the cache, not /tmp: same filesystem, and /tmp may be small.
        with tempfile.TemporaryDirectory(dir=cache_root(), prefix=f".fetch-{name}-") as work:
            work_dir = Path(work)
            versions = _download_and_extract(spec.debian_packages, work_dir, say)
            say(f"extracting text into {out_dir}")
            try:
                written = spec.build(work_dir / "root", out_dir, packages=versions, progress=say)
            except FileNotFoundError as exc:  # the packages changed their layout
                raise UserError(
                    f"{name}: the downloaded packages are not laid out as expected: {exc}"
                ) from exc
    return FetchResult(name, "fetched", out_dir, written, time.monotonic() - started)


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def _download_and_extract(
    packages: tuple[str, ...], work_dir: Path, say: Progress
) -> dict[str, str]:
    """`apt-get download` the packages into work_dir/debs and `dpkg -x` them into work_dir/root.

    Returns {package: version}. Versions are read from the .deb itself (the file name carries one
    too, but it changes with every security update, so nothing here depends on it).
    """
    for tool in ("apt-get", "dpkg", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise UserError(
                f"fetching needs {tool!r} (a Debian or Ubuntu system); it was not found on PATH"
            )
    debs_dir, root = work_dir / "debs", work_dir / "root"
    debs_dir.mkdir()
    root.mkdir()
    say(f"downloading {' '.join(packages)} (apt-get download)")
    done = _run(["apt-get", "download", *packages], debs_dir)
    if done.returncode != 0:
        # Package lists missing or stale (a fresh container, or a superseded security update):
        # refresh them once and retry, which needs root.
        say(
            f"apt-get download failed ({_last_line(done.stderr)}); running apt-get update and retrying"
        )
        if hasattr(os, "geteuid") and os.geteuid() != 0:
            raise UserError(
                f"apt-get download {' '.join(packages)} failed: {_last_line(done.stderr)}; "
                "run `sudo apt-get update`, then fetch again"
            )
        update = _run(["apt-get", "update"], debs_dir)
        if update.returncode != 0:
            raise UserError(f"apt-get update failed: {_last_line(update.stderr)}")
        done = _run(["apt-get", "download", *packages], debs_dir)
        if done.returncode != 0:
            raise UserError(
                f"apt-get download {' '.join(packages)} failed: {_last_line(done.stderr)}"
            )
    versions = {}
    for package in packages:
        debs = sorted(debs_dir.glob(f"{package}_*.deb"))
        if len(debs) != 1:
            raise UserError(
                f"expected one {package}_*.deb after apt-get download, found {len(debs)}"
            )
        deb = debs[0]
        version = _run(["dpkg-deb", "-f", str(deb), "Version"], debs_dir)
        versions[package] = version.stdout.strip()
        say(f"  {deb.name}: {deb.stat().st_size / 1e6:.1f} MB, version {versions[package]}")
        unpacked = _run(["dpkg", "-x", str(deb), str(root)], debs_dir)
        if unpacked.returncode != 0:
            raise UserError(f"dpkg -x {deb.name} failed: {_last_line(unpacked.stderr)}")
    return versions


def _last_line(text: str) -> str:
    lines = [
        line for line in text.strip().splitlines() if not line.startswith("W: ")
    ]  # warnings are noise
    return lines[-1] if lines else text.strip() or "no message"


# --------------------------------------------------------------------------------------------------
# LibreOffice help: HTML -> aligned paragraphs

_UNIT_TAGS = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6"})
# Tags that separate words when they occur inside a paragraph (text on either side is not glued).
_BREAK_TAGS = frozenset({"br", "div", "li", "td", "th", "tr", "ul", "ol", "table", "pre"})
_SWITCH_CLASSES = frozenset({"switchinline", "switch"})


class _HelpPageParser(HTMLParser):
    """Collects (id, text) of every <p>/<h1>..<h6> that has an id, in document order.

    Platform/module switches. The help marks variants as
    `<span class="switchinline"><span hidden="true" class="MAC">Command</span>
    <span hidden="true" id="default...">Ctrl</span></span>`; the viewer shows one case (the one for
    the reader's system or module, else the default). Stripping tags naively glues every case
    together ("Use the shortcut CommandCtrl + F", "LibreOffice - PreferencesTools - Options"), which
    is not a sentence of either language. Inside a paragraph we therefore keep exactly one case, what
    the help shows on Linux: the UNIX case if the switch has one, else the default case, else
    nothing. Block switches (whole paragraphs per case, outside any paragraph) are kept as they are:
    each paragraph in them is a whole, real paragraph.
    """

    def __init__(self):
        super().__init__(convert_charrefs=True)  # entities (&amp;, &#8211;, ...) arrive unescaped
        self.units: list[tuple[str, str]] = []
        self.switches_resolved = 0
        self._unit: tuple[str, str] | None = None  # (tag, id) of the paragraph being collected
        self._sinks: list[
            list[str]
        ] = []  # text goes to _sinks[-1]: the paragraph, or a switch case
        self._spans: list[str] = []  # role of each open <span>: "plain", "switch" or "case"
        self._switches: list[
            dict[str, list[str]]
        ] = []  # open switches in this paragraph: case -> text

    # paragraph boundaries
    def _start_unit(self, tag: str, unit_id: str) -> None:
        if self._unit is not None:  # a <p> inside a <p> implicitly closes the first, as in HTML
            self._end_unit()
        self._unit = (tag, unit_id)
        self._sinks = [[]]
        self._switches = []

    def _end_unit(self) -> None:
        _tag, unit_id = self._unit
        self.units.append((unit_id, "".join(self._sinks[0])))
        self._unit = None
        self._sinks = []
        self._switches = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag in _UNIT_TAGS and attributes.get("id"):
            self._start_unit(tag, attributes["id"])
            return
        if self._unit is None:
            if tag == "span":
                self._spans.append("plain")
            return
        if tag == "span":
            classes = (attributes.get("class") or "").split()
            if _SWITCH_CLASSES.intersection(classes):
                self._spans.append("switch")
                self._switches.append({})
            elif (
                self._spans
                and self._spans[-1] == "switch"
                and "hidden" in attributes
                and self._switches
            ):
                case = (
                    "default"
                    if (attributes.get("id") or "").startswith("default")
                    else (classes or ["?"])[0]
                )
                self._spans.append("case")
                self._sinks.append(self._switches[-1].setdefault(case, []))
            else:
                self._spans.append("plain")
        elif tag in _BREAK_TAGS:
            self._sinks[-1].append(" ")

    def handle_startendtag(self, tag, attrs):
        # <br/>, <img/>: never open anything
        if self._unit is not None and tag in _BREAK_TAGS:
            self._sinks[-1].append(" ")
        elif tag in _UNIT_TAGS:
            attributes = dict(attrs)
            if attributes.get("id"):
                self._start_unit(tag, attributes["id"])
                self._end_unit()

    def handle_endtag(self, tag):
        if tag == "span":
            role = self._spans.pop() if self._spans else "plain"
            if self._unit is None:
                return
            if role == "case" and len(self._sinks) > 1:
                self._sinks.pop()
            elif role == "switch" and self._switches:
                cases = self._switches.pop()
                chosen = cases.get("UNIX", cases.get("default", []))
                self._sinks[-1].append("".join(chosen))
                self.switches_resolved += 1
            return
        if self._unit is not None:
            if tag == self._unit[0]:
                self._end_unit()
            elif tag in _BREAK_TAGS:
                self._sinks[-1].append(" ")

    def handle_data(self, data):
        if self._unit is not None:
            self._sinks[-1].append(data)

    def close(self):
        super().close()
        if self._unit is not None:  # unterminated last paragraph
            self._end_unit()


def clean_text(text: str) -> str:
    """Collapse every run of whitespace (incl. newlines, tabs, no-break and ideographic spaces) to one space."""
    return " ".join(text.split())


def parse_help_page(html: str) -> tuple[list[tuple[str, str]], int]:
    """[(key, text)] of one help page plus the number of inline switches resolved.

    key is the paragraph id, suffixed `#k` for its k-th repeat in the page (the same id can occur in
    several cases of a block switch; all languages share the page structure, so the k-th repeat in
    one language is the k-th repeat in another).
    """
    parser = _HelpPageParser()
    parser.feed(html)
    parser.close()
    seen: dict[str, int] = {}
    keyed = []
    for unit_id, text in parser.units:
        repeat = seen.get(unit_id, 0)
        seen[unit_id] = repeat + 1
        keyed.append((unit_id if repeat == 0 else f"{unit_id}#{repeat}", clean_text(text)))
    return keyed, parser.switches_resolved


LIBREOFFICE_HELP_PACKAGES = (
    "libreoffice-help-en-us",
    "libreoffice-help-zh-cn",
    "libreoffice-help-de",
)
HELP_LANGUAGES = {"en": "en-US", "zh": "zh-CN", "de": "de"}
# A Chinese paragraph without a single Han character is an English fallback the translators have
# not yet replaced (often an older wording of the English, so it is not caught by equality).
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_REQUIRED_SCRIPT = {"zh": _HAN}
HELP_SUBDIR = Path("usr/share/libreoffice/help")
HELP_COPYRIGHT = Path("usr/share/doc/libreoffice-help-en-us/copyright")


def _read_help_language(
    help_root: Path, folder: str
) -> tuple[dict[tuple[str, str], str], int, int]:
    """{(relative page path, key): text} for one language, the number of pages and of resolved switches."""
    text_root = help_root / folder / "text"
    paragraphs: dict[tuple[str, str], str] = {}
    pages = switches = 0
    for page in sorted(text_root.rglob("*.html")):
        relative = page.relative_to(text_root).as_posix()
        keyed, resolved = parse_help_page(page.read_text(encoding="utf-8", errors="replace"))
        pages += 1
        switches += resolved
        for key, text in keyed:
            paragraphs[(relative, key)] = text
    return paragraphs, pages, switches


def _aligned_pairs(source: dict, english: dict, stats: dict, side: str) -> list[tuple[str, str]]:
    """(source, english) for every paragraph key present in both languages, filtered and deduplicated.

    Dropped, each counted in stats:
    - empty: either side has no text (icon-only cells, empty headings);
    - untranslated: the source text equals the English text (left in English by the translators, or
      pure code / names / numbers), or for Chinese has no Han character at all (an English fallback
      or a formula): no translation signal, and it would teach a model to copy;
    - duplicate: the same (source, english) pair seen earlier in sorted order (boilerplate such as
      "Related Topics" recurs on hundreds of pages).
    """
    pairs, seen = [], set()
    counts = {"aligned": 0, "empty": 0, "untranslated": 0, "duplicate": 0}
    required_script = _REQUIRED_SCRIPT.get(side)
    for key in sorted(
        source.keys() & english.keys()
    ):  # (page path, paragraph key): same order everywhere
        src, tgt = source[key], english[key]
        counts["aligned"] += 1
        if not src or not tgt:
            counts["empty"] += 1
        elif src == tgt or (required_script is not None and not required_script.search(src)):
            counts["untranslated"] += 1
        elif (src, tgt) in seen:
            counts["duplicate"] += 1
        else:
            seen.add((src, tgt))
            pairs.append((src, tgt))
    counts["kept"] = len(pairs)
    stats[f"{side}-en"] = counts
    return pairs


def build_libreoffice_help(
    extracted_root: Path,
    out_dir: Path,
    *,
    packages: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> dict:
    """Build the libreoffice-help corpus from unpacked packages (`dpkg -x` of all three into one root).

    Writes en.txt (unique English paragraphs, sorted by page path then paragraph id), zh-en.tsv and
    de-en.tsv (source<TAB>english), LICENSE.txt and, last, manifest.json. Returns the manifest.
    """
    say = progress or (lambda _msg: None)
    extracted_root = Path(extracted_root)
    help_root = extracted_root / HELP_SUBDIR
    copyright_file = extracted_root / HELP_COPYRIGHT
    if not copyright_file.is_file():
        raise FileNotFoundError(f"license file not found in the unpacked package: {copyright_file}")
    by_language, stats = {}, {"pages": {}, "paragraphs": {}, "inline_switches_resolved": {}}
    for side, folder in HELP_LANGUAGES.items():
        if not (help_root / folder / "text").is_dir():
            raise FileNotFoundError(
                f"help pages for {folder} not found under {help_root / folder / 'text'}"
            )
        paragraphs, pages, switches = _read_help_language(help_root, folder)
        by_language[side] = paragraphs
        stats["pages"][side] = pages
        stats["paragraphs"][side] = len(paragraphs)
        stats["inline_switches_resolved"][side] = switches
        say(
            f"  {folder}: {pages} pages, {len(paragraphs)} paragraphs with ids, "
            f"{switches} inline platform/module switches resolved"
        )

    english = by_language["en"]
    en_lines, seen = [], set()
    for key in sorted(english):
        text = english[key]
        if text and text not in seen:
            seen.add(text)
            en_lines.append(text)
    stats["en"] = {
        "paragraphs": len(english),
        "empty": sum(1 for t in english.values() if not t),
        "kept_unique": len(en_lines),
    }
    zh_en = _aligned_pairs(by_language["zh"], english, stats, "zh")
    de_en = _aligned_pairs(by_language["de"], english, stats, "de")

    license_text = (
        "The libreoffice-help corpus is text extracted from the Debian packages "
        f"{', '.join(LIBREOFFICE_HELP_PACKAGES)} (LibreOffice help, en-US / zh-CN / de).\n"
        "License: MPL-2.0 (https://www.mozilla.org/MPL/2.0/), parts Apache-2.0; "
        "the Debian copyright file of libreoffice-help-en-us follows.\n\n"
        + copyright_file.read_text(encoding="utf-8", errors="replace")
    )
    files = {
        "en.txt": _lines_bytes([_tsv_field(line) for line in en_lines]),
        "zh-en.tsv": _lines_bytes([f"{_tsv_field(s)}\t{_tsv_field(t)}" for s, t in zh_en]),
        "de-en.tsv": _lines_bytes([f"{_tsv_field(s)}\t{_tsv_field(t)}" for s, t in de_en]),
        "LICENSE.txt": license_text.encode("utf-8"),
    }
    spec = CORPORA["libreoffice-help"]
    return write_corpus(
        Path(out_dir),
        files,
        {
            "name": spec.name,
            "description": spec.description,
            "license": spec.license,
            "copyright": _debian_copyright_holders(
                copyright_file.read_text(encoding="utf-8", errors="replace")
            ),
            "license_file": "LICENSE.txt",
            "packages": packages or {},
            "stats": stats,
        },
    )


def _debian_copyright_holders(text: str) -> list[str]:
    """The Copyright: lines of the first `Files: *` stanza of a Debian copyright file (the holders of
    the help text itself; later stanzas cover fonts and code not in this corpus)."""
    holders, in_main, in_copyright = [], False, False
    for line in text.splitlines():
        if line.startswith("Files:"):
            if in_main:
                break
            in_main = line.split(":", 1)[1].strip() == "*"
            continue
        if not in_main:
            continue
        if line.startswith("Copyright:"):
            in_copyright = True
            line = line.split(":", 1)[1]
        elif not line.startswith((" ", "\t")):
            in_copyright = False
        if in_copyright and line.strip():
            holders.append(line.strip())
    return holders


CORPORA: dict[str, CorpusSpec] = {
    "libreoffice-help": CorpusSpec(
        name="libreoffice-help",
        description="LibreOffice help pages, paragraph-aligned zh-en and de-en pairs plus English text",
        license="MPL-2.0",
        debian_packages=LIBREOFFICE_HELP_PACKAGES,
        build=build_libreoffice_help,
        text_sides={"en": ("en.txt", None), "zh": ("zh-en.tsv", 0), "de": ("de-en.tsv", 0)},
        pair_sides={"zh-en": "zh-en.tsv", "de-en": "de-en.tsv"},
    ),
}


def build_from_extracted(
    extracted_root: Path, out_dir: Path, name: str = "libreoffice-help", **kwargs
) -> dict:
    """Build corpus `name` from already unpacked packages (what `fetch` does after apt; tests use it)."""
    return _spec(name).build(Path(extracted_root), Path(out_dir), **kwargs)


def list_corpora() -> list[dict]:
    """Every registered corpus: name, description, license, present, size (bytes), path."""
    rows = []
    for name, spec in CORPORA.items():
        present = is_present(name)
        found = _read_manifest(corpus_path(name)) if present else None
        size = sum(entry["bytes"] for entry in found["files"].values()) if found else 0
        rows.append(
            {
                "name": name,
                "description": spec.description,
                "license": spec.license,
                "present": present,
                "size": size,
                "path": str(corpus_path(name)),
            }
        )
    return rows


# --------------------------------------------------------------------------------------------------
# Sources: what studies load


@dataclass(frozen=True)
class _Source:
    kind: str  # "corpus", "file" or "moses"
    corpus: str | None = None
    side: str | None = None
    paths: tuple[Path, ...] = ()


def _known_corpus_sources() -> list[str]:
    return [
        f"{name}:{side}"
        for name, spec in CORPORA.items()
        for side in [*spec.text_sides, *spec.pair_sides]
    ]


def _parse_source(source: str) -> _Source:
    """Resolve a source string (no I/O beyond checking whether a path exists)."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"a data source must be a non-empty string, got {source!r}")
    if source.startswith("moses:"):
        parts = source.split(":")
        if len(parts) < 4 or not all(parts[1:]):
            raise ValueError(
                f"moses source {source!r} must be 'moses:PATH_PREFIX:SRC:TGT' "
                "(files PATH_PREFIX.SRC and PATH_PREFIX.TGT)"
            )
        # the prefix may itself contain ':'; the last two fields are the language suffixes
        prefix, src, tgt = ":".join(parts[1:-2]), parts[-2], parts[-1]
        return _Source("moses", paths=(Path(f"{prefix}.{src}"), Path(f"{prefix}.{tgt}")))
    name, sep, side = source.partition(":")
    if sep and name in CORPORA:
        return _Source("corpus", corpus=name, side=side)
    path = Path(source).expanduser()
    if path.exists():
        return _Source("file", paths=(path,))
    if sep and "/" not in source and "." not in name:
        # looks like NAME:SIDE, not a path: the likelier mistake is the corpus name
        raise ValueError(
            f"unknown data source {source!r}{did_you_mean(source, _known_corpus_sources())}; "
            f"registered: {', '.join(_known_corpus_sources())}; or give a path to a .txt/.tsv "
            "file or 'moses:PATH_PREFIX:SRC:TGT'"
        )
    raise FileNotFoundError(
        f"data file not found: {source} (a source is a registered corpus such as "
        f"'{_known_corpus_sources()[0]}', a path to a .txt/.tsv file, or "
        "'moses:PATH_PREFIX:SRC:TGT')"
    )


def _corpus_side(parsed: _Source, pairs: bool) -> tuple[str, int | None]:
    spec = CORPORA[parsed.corpus]
    sides = spec.pair_sides if pairs else spec.text_sides
    if parsed.side in sides:
        return (sides[parsed.side], None) if pairs else sides[parsed.side]
    other = spec.text_sides if pairs else spec.pair_sides
    what = "pair" if pairs else "text"
    hint = (
        (
            f"; '{parsed.side}' is a {'text' if pairs else 'pair'} side, load it with "
            f"{'load_text' if pairs else 'load_pairs'}"
        )
        if parsed.side in other
        else did_you_mean(parsed.side, sides)
    )
    raise ValueError(
        f"corpus {parsed.corpus!r} has no {what} side {parsed.side!r}{hint}; "
        f"{what} sides: {', '.join(sides)}"
    )


def _read_user_file(path: Path) -> list[str]:
    """Lines of a UTF-8 file (a BOM is tolerated). Split on '\\n' only: str.splitlines() would also
    split on U+2028, U+0085 and friends inside a sentence and shift every later line of a parallel
    file out of alignment."""
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"{path}:{line}: not UTF-8 text (byte {exc.start}); convert the file to UTF-8"
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start an empty one
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _tsv_pairs(lines: list[str], where: str) -> list[tuple[str, str]]:
    """source<TAB>target per line; blank lines are skipped, columns after the second are ignored."""
    pairs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        columns = line.split("\t", 2)
        if len(columns) < 2:
            raise ValueError(f"{where}:{number}: expected 'source<TAB>target', found no tab")
        pairs.append((columns[0].strip(), columns[1].strip()))
    return pairs


def load_text(source: str) -> list[str]:
    """Monolingual texts of a source: a registered corpus side (`libreoffice-help:en`), a `.tsv` file
    (its first column) or any other text file (one text per line). Blank lines are skipped."""
    parsed = _parse_source(source)
    if parsed.kind == "moses":
        raise ValueError(
            f"{source!r} is a pair source; use load_pairs, or load_text on one of its files "
            f"({parsed.paths[0]})"
        )
    if parsed.kind == "corpus":
        filename, column = _corpus_side(parsed, pairs=False)
        lines = _read_corpus_file(parsed.corpus, filename).split("\n")
        if column is None:
            return [line for line in lines if line]
        # one side of a pair file: unique texts in file order (a zh paragraph can pair with two English ones)
        texts = (line.split("\t", column + 1)[column] for line in lines if line)
        return list(dict.fromkeys(text for text in texts if text))
    path = parsed.paths[0]
    lines = _read_user_file(path)
    if path.suffix.lower() == ".tsv":
        lines = [line.split("\t", 1)[0] for line in lines]
    return [line.strip() for line in lines if line.strip()]


def load_pairs(source: str) -> list[tuple[str, str]]:
    """(source, target) pairs: a registered corpus pair side (`libreoffice-help:zh-en`), a `.tsv` file
    (source<TAB>target) or `moses:PATH_PREFIX:SRC:TGT` (line-aligned files; a line pair with an empty
    side is skipped, as Moses' clean-corpus does)."""
    parsed = _parse_source(source)
    if parsed.kind == "corpus":
        filename, _ = _corpus_side(parsed, pairs=True)
        # our own files: exactly one tab per line, no blank lines, already clean (fast path)
        lines = _read_corpus_file(parsed.corpus, filename).split("\n")
        return [tuple(line.split("\t", 1)) for line in lines if line]
    if parsed.kind == "moses":
        src_path, tgt_path = parsed.paths
        src_lines, tgt_lines = _read_user_file(src_path), _read_user_file(tgt_path)
        if len(src_lines) != len(tgt_lines):
            raise ValueError(
                f"moses files are not line-aligned: {src_path} has {len(src_lines)} lines, "
                f"{tgt_path} has {len(tgt_lines)}"
            )
        return [
            (s.strip(), t.strip()) for s, t in zip(src_lines, tgt_lines) if s.strip() and t.strip()
        ]
    path = parsed.paths[0]
    if path.suffix.lower() != ".tsv":
        raise ValueError(
            f"{path}: pairs need a .tsv file (source<TAB>target) or 'moses:PATH_PREFIX:SRC:TGT'"
        )
    return _tsv_pairs(_read_user_file(path), str(path))


def source_fingerprint(source: str) -> str:
    """sha256 identifying the exact data `source` resolves to, for keying caches (tokenizers,
    teachers): a registered corpus side hashes its manifest's file hash with the side; a user file is
    the sha256 of its bytes; moses hashes both files' hashes. Paths do not enter: moving a file keeps
    its fingerprint, editing it changes it."""
    parsed = _parse_source(source)
    if parsed.kind == "corpus":
        sides = CORPORA[parsed.corpus]
        if parsed.side in sides.pair_sides:
            filename = sides.pair_sides[parsed.side]
        else:
            filename, _ = _corpus_side(parsed, pairs=False)
        file_sha = manifest(parsed.corpus)["files"][filename]["sha256"]
        return hashlib.sha256(
            f"corpus:{parsed.corpus}:{parsed.side}:{file_sha}".encode()
        ).hexdigest()
    for path in parsed.paths:
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {path}")
    if parsed.kind == "file":
        return _sha256_file(parsed.paths[0])
    src_path, tgt_path = parsed.paths
    combined = f"moses:{src_path.suffix}:{_sha256_file(src_path)}:{tgt_path.suffix}:{_sha256_file(tgt_path)}"
    return hashlib.sha256(combined.encode()).hexdigest()


def check_source(source: str, kind: str | None = None) -> str | None:
    """None if `source` can be loaded, else one line saying why and how to fix it (for a study's
    preflight). `kind` ("text" or "pairs") also checks that the source is of that kind. Cheap: a
    registered corpus is checked by its manifest and file sizes, user files by existence (and, for
    moses, equal line counts), not by parsing every line."""
    if kind not in (None, "text", "pairs"):
        raise ValueError(f"kind must be 'text', 'pairs' or None, got {kind!r}")
    try:
        parsed = _parse_source(source)
        if parsed.kind == "corpus":
            spec = CORPORA[parsed.corpus]
            if kind is None:
                if parsed.side not in spec.text_sides and parsed.side not in spec.pair_sides:
                    _corpus_side(parsed, pairs=False)
            else:
                _corpus_side(parsed, pairs=kind == "pairs")
            problem = _presence_problem(parsed.corpus)
            return problem
        for path in parsed.paths:
            if not path.is_file():
                return f"data file not found: {path}"
        if parsed.kind == "moses":
            if kind == "text":
                return (
                    f"{source!r} is a pair source, not text; use one of its files as a text source"
                )
            counts = [_count_lines(path) for path in parsed.paths]
            if counts[0] != counts[1]:
                return (
                    f"moses files are not line-aligned: {parsed.paths[0]} has {counts[0]} lines, "
                    f"{parsed.paths[1]} has {counts[1]}"
                )
        elif kind == "pairs" and parsed.paths[0].suffix.lower() != ".tsv":
            return f"{parsed.paths[0]}: pairs need a .tsv file (source<TAB>target) or 'moses:PATH_PREFIX:SRC:TGT'"
    except (ValueError, OSError, UserError) as exc:
        return str(exc)
    return None


def _count_lines(path: Path) -> int:
    """Line count as _read_user_file sees it: newlines, plus one for a last line without newline."""
    newlines, last = 0, b""
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            newlines += block.count(b"\n")
            last = block
    return newlines + (1 if last and not last.endswith(b"\n") else 0)
