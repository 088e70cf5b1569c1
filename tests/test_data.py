"""gates.data: corpora built from (synthetic) LibreOffice help pages, the cache, user files.

No network and no apt: the package tree is written by hand in tmp_path with the same layout and
markup as the real libreoffice-help-* packages, and `fetch` gets a fake download step.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gates.errors import UserError
from gates.models import corpora as data

HEAD = """<!DOCTYPE html>
<html lang="{lang}" dir="ltr">
<head><meta http-equiv="Content-Type" content="text/html; charset=utf-8"><title>t</title></head>
<body>
<header id="TopLeftHeader"><a class="logo" href="x"><p dir="auto">LibreOffice 7.4 Help</p></a></header>
<div id="DisplayArea" itemprop="softwareHelp">
"""
FOOT = """</div>
<footer><div id="DEBUG" class="debug"><p dir="auto">This page is: /text/x.xhp</p>
<p id="bm_module" dir="auto"></p><p id="bm_system" dir="auto"></p></div></footer>
</body></html>
"""


def switch(mac: str, default: str, unix: str | None = None) -> str:
    """An inline platform switch as the help generator writes it."""
    unix_case = f'<span hidden="true" id="UNIXtextx_1" class="UNIX">{unix}</span>' if unix else ""
    return (
        '<span id="swlnsystextx_1" class="switchinline">'
        f'<span hidden="true" id="MACtextx_1" class="MAC"><span class="keycode">{mac}</span></span>{unix_case}'
        f'<span hidden="true" id="defaulttextx_1"><span class="keycode">{default}</span></span></span>'
    )


# page -> language -> list of (tag, id, inner html); languages share ids, as in the real packages
PAGES = {
    "shared/01/find.html": {
        "en": [
            ("h1", "hd_id1", "Find &amp; Replace"),
            (
                "p",
                "par_id1",
                f'Press {switch("Command", "Ctrl")}<span class="keycode"> + F</span> to\n   search.',
            ),
            ("p", "par_id2", '<img src="icon.svg" alt="Icon">'),  # icon-only: empty
            ("p", "par_id3", "Related Topics"),
            ("p", "par_id4", "SUM(A1:A3)"),
            ("p", "par_id5", "Only in English."),
            (
                "p",
                "par_id6",
                "Uses &lt;b&gt;, the&nbsp;non-breaking space and &#8211; dashes.<br>Second line.",
            ),
            ("p", "par_id8", "A paragraph no translation has."),
        ],
        "zh": [
            ("h1", "hd_id1", "查找和替换"),
            (
                "p",
                "par_id1",
                f'按 {switch("Command", "Ctrl")}<span class="keycode"> + F</span> 搜索。',
            ),
            ("p", "par_id2", '<img src="icon.svg" alt="图标">'),
            ("p", "par_id3", "相关主题"),
            ("p", "par_id4", "SUM(A1:A3)"),  # code: identical in both languages
            ("p", "par_id5", "Only in English."),  # untranslated fallback
            ("p", "par_id6", "「B」"),  # no Han character: no translation signal
            ("p", "par_id88", "只有中文有的段落。"),
        ],  # a paragraph English does not have
        "de": [
            ("h1", "hd_id1", "Suchen &amp; Ersetzen"),
            (
                "p",
                "par_id1",
                f'Drücken Sie {switch("Befehl", "Strg")}<span class="keycode"> + F</span>.',
            ),
            ("p", "par_id2", '<img src="icon.svg" alt="Symbol">'),
            ("p", "par_id3", "Verwandte Themen"),
            ("p", "par_id4", "SUMME(A1:A3)"),
            ("p", "par_id5", ""),
            ("p", "par_id6", "Verwendet &lt;b&gt; und &#8211; Striche. Zweite Zeile."),
        ],
    },
    "scalc/01/sum.html": {
        # the ids are listed in another order per language: alignment is by id, not position
        "en": [
            ("p", "par_id3", "Related Topics"),
            (
                "p",
                "par_id1",
                f"Choose {switch('LibreOffice - Preferences', 'Tools - Options', unix='Tools - Linux')}.",
            ),
            ("p", "par_id9", "Adds numbers."),
        ],
        "zh": [
            ("p", "par_id9", "将数字相加。"),
            ("p", "par_id3", "相关主题"),
            (
                "p",
                "par_id1",
                f"选择{switch('LibreOffice - 偏好设置', '工具 - 选项', unix='工具 - Linux')}。",
            ),
        ],
        "de": [
            (
                "p",
                "par_id1",
                f"Wählen Sie {switch('LibreOffice - Einstellungen', 'Extras - Optionen', unix='Extras - Linux')}.",
            ),
            ("p", "par_id9", "Addiert Zahlen."),
            ("p", "par_id3", "Verwandte Themen"),
        ],
    },
}
FOLDERS = {"en": "en-US", "zh": "zh-CN", "de": "de"}
COPYRIGHT = (
    "Format: x\n\nFiles: *\nCopyright: Copyright 2000 Example Holder.\nLicense: MPL-2.0\n Text.\n"
)


def write_help_tree(root: Path, pages=PAGES) -> Path:
    """Lay out pages like `dpkg -x` of the three libreoffice-help packages into root."""
    for relative, by_language in pages.items():
        for language, paragraphs in by_language.items():
            page = root / "usr/share/libreoffice/help" / FOLDERS[language] / "text" / relative
            page.parent.mkdir(parents=True, exist_ok=True)
            body = "\n".join(
                f'<{tag} id="{pid}" class="paragraph" dir="auto">{inner}</{tag}>'
                for tag, pid, inner in paragraphs
            )
            page.write_text(HEAD.format(lang=FOLDERS[language]) + body + FOOT, encoding="utf-8")
    doc = root / "usr/share/doc/libreoffice-help-en-us"
    doc.mkdir(parents=True, exist_ok=True)
    (doc / "copyright").write_text(COPYRIGHT)
    return root


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEHEAP_GATES_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def built(tmp_path, cache):
    """The libreoffice-help corpus built from the synthetic tree into the (temporary) cache."""
    root = write_help_tree(tmp_path / "extracted")
    data.build_from_extracted(
        root, data.corpus_path("libreoffice-help"), packages={"libreoffice-help-en-us": "1:1"}
    )
    return data.corpus_path("libreoffice-help")


def read_tsv(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()]


# --- extraction -------------------------------------------------------------------------------------


def test_pairs_align_by_page_and_id_not_position(built):
    zh_en = read_tsv(built / "zh-en.tsv")
    assert ["将数字相加。", "Adds numbers."] in zh_en
    assert ["查找和替换", "Find & Replace"] in zh_en
    de_en = read_tsv(built / "de-en.tsv")
    assert ["Addiert Zahlen.", "Adds numbers."] in de_en
    assert ["Suchen & Ersetzen", "Find & Replace"] in de_en
    # a paragraph on one side only is in no pair (but English ones are still English text)
    assert (
        "A paragraph no translation has."
        in (built / "en.txt").read_text(encoding="utf-8").splitlines()
    )
    assert not any("A paragraph no translation has." in row[1] for row in zh_en + de_en)
    assert not any("只有中文有的段落。" in row[0] for row in zh_en)
    assert "只有中文有的段落。" not in data.load_text("libreoffice-help:zh")
    # every pair has exactly one tab
    assert all(len(row) == 2 for row in zh_en + de_en)


def test_tags_stripped_entities_unescaped_whitespace_collapsed(built):
    english = (built / "en.txt").read_text(encoding="utf-8").splitlines()
    assert "Find & Replace" in english
    assert "Uses <b>, the non-breaking space and \u2013 dashes. Second line." in english
    assert "Press Ctrl + F to search." in english
    assert not any("<" in line and "<b>" not in line for line in english)
    assert (
        "LibreOffice 7.4 Help" not in english
    )  # paragraphs without id are page chrome, not content


def test_inline_platform_switch_keeps_one_case_never_glued(built):
    english = (built / "en.txt").read_text(encoding="utf-8")
    assert "CommandCtrl" not in english and "Command" not in english
    assert "Choose Tools - Linux." in english.splitlines()  # the UNIX case wins when there is one
    assert "Preferences" not in english and "Tools - Options" not in english
    zh = [row[0] for row in read_tsv(built / "zh-en.tsv")]
    assert "按 Ctrl + F 搜索。" in zh


def test_parse_help_page_switch_without_default_or_unix_case_is_dropped():
    html = (
        '<p id="a">Select <span class="switchinline"><span hidden="true" id="CALCx" class="CALC">cells'
        "</span></span>objects.</p>"
    )
    keyed, resolved = data.parse_help_page(html)
    assert keyed == [("a", "Select objects.")] and resolved == 1


def test_parse_help_page_repeated_id_in_block_switch_keeps_both_with_occurrence_keys():
    html = (
        '<span class="switch"><span hidden="true" class="UNIX"><h2 id="x">Email</h2></span>'
        '<span hidden="true" class="MAC"><h2 id="x">Mail</h2></span></span>'
    )
    keyed, _ = data.parse_help_page(html)
    assert keyed == [("x", "Email"), ("x#1", "Mail")]


def test_filters_drop_empty_untranslated_and_scriptless_pairs(built):
    zh_en = read_tsv(built / "zh-en.tsv")
    sources = [row[0] for row in zh_en]
    assert "SUM(A1:A3)" not in sources  # identical in both languages
    assert "Only in English." not in sources  # untranslated fallback
    assert "「B」" not in sources  # no Han character
    assert not any(not s or not t for s, t in zh_en)  # icon-only paragraph dropped
    de_sources = [row[0] for row in read_tsv(built / "de-en.tsv")]
    assert "SUMME(A1:A3)" in de_sources  # German needs no Han check
    stats = data.manifest("libreoffice-help")["stats"]
    assert stats["zh-en"]["untranslated"] == 3
    # icon-only paragraph, the empty German one, and the two empty footer ids of each of the 2 pages
    assert stats["de-en"]["empty"] == 1 + 1 + 2 * 2
    assert stats["zh-en"]["kept"] == len(zh_en)


def test_duplicates_removed_and_order_is_by_page_then_id(built):
    zh_en = read_tsv(built / "zh-en.tsv")
    assert zh_en.count(["相关主题", "Related Topics"]) == 1
    english = (built / "en.txt").read_text(encoding="utf-8").splitlines()
    assert english.count("Related Topics") == 1
    assert len(english) == len(set(english))
    # scalc/... sorts before shared/...; within a page, hd_id1 < par_id1 < par_id3
    assert english[0].startswith("Choose")
    assert english.index("Find & Replace") < english.index("Press Ctrl + F to search.")


def test_tsv_field_replaces_tabs_and_newlines():
    assert data._tsv_field("a\tb\nc\r\nd") == "a b c  d"


def test_build_is_deterministic(tmp_path, cache):
    root = write_help_tree(tmp_path / "extracted")
    first = data.build_from_extracted(root, tmp_path / "one")
    second = data.build_from_extracted(root, tmp_path / "two")
    assert first["files"] == second["files"]


def test_build_needs_the_license_file(tmp_path, cache):
    root = write_help_tree(tmp_path / "extracted")
    (root / data.HELP_COPYRIGHT).unlink()
    with pytest.raises(FileNotFoundError, match="license"):
        data.build_from_extracted(root, tmp_path / "out")


# --- manifest, verification, presence ---------------------------------------------------------------


def test_manifest_records_every_file_hash_size_and_lines(built):
    found = json.loads((built / "manifest.json").read_text())
    assert set(found["files"]) == {"en.txt", "zh-en.tsv", "de-en.tsv", "LICENSE.txt"}
    for filename, entry in found["files"].items():
        content = (built / filename).read_bytes()
        assert entry == {
            "sha256": hashlib.sha256(content).hexdigest(),
            "bytes": len(content),
            "lines": content.count(b"\n"),
        }
    assert found["license"] == "MPL-2.0" and found["packages"] == {"libreoffice-help-en-us": "1:1"}
    assert found["copyright"] == ["Copyright 2000 Example Holder."]
    assert "Example Holder" in (built / "LICENSE.txt").read_text()
    assert data.verify("libreoffice-help") == []


def test_tampering_is_detected_by_verify_and_by_reads(built):
    path = built / "en.txt"
    content = path.read_bytes()
    path.write_bytes(content.replace(b"Adds", b"Adda"))  # same size: only the hash can tell
    problems = data.verify("libreoffice-help")
    assert len(problems) == 1 and "en.txt" in problems[0] and "--force" in problems[0]
    with pytest.raises(data.CorpusCorrupt, match="gates data fetch libreoffice-help --force"):
        data.load_text("libreoffice-help:en")
    path.write_bytes(content + b"extra\n")  # other size: even the cheap presence check fails
    with pytest.raises(data.CorpusMissing, match="en.txt"):
        data.corpus_dir("libreoffice-help")


def test_corpus_missing_message_names_the_exact_command(cache):
    with pytest.raises(data.CorpusMissing) as info:
        data.corpus_dir("libreoffice-help")
    assert str(info.value) == (
        "corpus 'libreoffice-help' is not fetched; run: gates data fetch libreoffice-help"
    )
    with pytest.raises(data.CorpusMissing, match="run: gates data fetch libreoffice-help"):
        data.load_pairs("libreoffice-help:zh-en")
    assert data.check_source("libreoffice-help:zh-en") == str(info.value)


def test_manifest_is_the_commit_point(built):
    (built / "manifest.json").unlink()
    assert not data.is_present("libreoffice-help")
    with pytest.raises(data.CorpusMissing):
        data.corpus_dir("libreoffice-help")


def test_corpus_from_another_build_format_counts_as_missing(built):
    found = json.loads((built / "manifest.json").read_text())
    found["build_format"] = data.BUILD_FORMAT + 1
    (built / "manifest.json").write_text(json.dumps(found))
    with pytest.raises(data.CorpusMissing, match="another version of gates"):
        data.corpus_dir("libreoffice-help")


def test_list_corpora(built):
    (row,) = [r for r in data.list_corpora() if r["name"] == "libreoffice-help"]
    assert row["present"] is True and row["license"] == "MPL-2.0"
    assert row["size"] == sum(
        p.stat().st_size for p in built.iterdir() if p.name != "manifest.json"
    )
    assert row["path"] == str(built)


# --- fetch (apt replaced by a fake that unpacks the synthetic tree) -----------------------------------


@pytest.fixture
def fake_apt(tmp_path, cache, monkeypatch):
    calls = []

    def download_and_extract(packages, work_dir, say):
        calls.append(packages)
        write_help_tree(work_dir / "root")
        return {package: "1:7.4-test" for package in packages}

    monkeypatch.setattr(data, "_download_and_extract", download_and_extract)
    return calls


def test_fetch_is_idempotent_and_force_refetches(fake_apt):
    first = data.fetch("libreoffice-help")
    assert first.status == "fetched" and len(fake_apt) == 1
    second = data.fetch("libreoffice-help")
    assert second.status == "already present" and len(fake_apt) == 1
    assert second.manifest["files"] == first.manifest["files"]
    third = data.fetch("libreoffice-help", force=True)
    assert third.status == "fetched" and len(fake_apt) == 2
    # a damaged corpus is rebuilt by a plain fetch
    (third.path / "zh-en.tsv").write_text("broken\n")
    assert data.fetch("libreoffice-help").status == "fetched" and len(fake_apt) == 3
    assert data.verify("libreoffice-help") == []
    # the work folder is cleaned up
    assert [p.name for p in data.cache_root().iterdir() if p.name.startswith(".fetch")] == []


class FakeApt:
    """Stands in for apt-get / dpkg-deb / dpkg: the first download fails as with missing package lists."""

    VERSION = "4:7.4.7-1+deb12u14"

    def __init__(self, lists_missing=True):
        self.commands = []
        self.lists_missing = lists_missing

    def __call__(self, cmd, cwd):
        self.commands.append(cmd[:2])
        if cmd[:2] == ["apt-get", "download"]:
            if self.lists_missing:
                return subprocess.CompletedProcess(
                    cmd, 100, "", "E: Unable to locate package libreoffice-help-de"
                )
            for package in cmd[2:]:  # named as apt names them: version with an escaped epoch
                (Path(cwd) / f"{package}_4%3a7.4.7-1+deb12u14_all.deb").write_bytes(b"deb")
        elif cmd[:2] == ["apt-get", "update"]:
            self.lists_missing = False
        elif cmd[0] == "dpkg-deb":
            return subprocess.CompletedProcess(cmd, 0, self.VERSION + "\n", "")
        return subprocess.CompletedProcess(cmd, 0, "", "")


def test_download_runs_apt_get_update_once_when_lists_are_missing(tmp_path, monkeypatch):
    fake = FakeApt()
    monkeypatch.setattr(data, "_run", fake)
    monkeypatch.setattr(data.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(data.os, "geteuid", lambda: 0)
    versions = data._download_and_extract(data.LIBREOFFICE_HELP_PACKAGES, tmp_path, lambda _m: None)
    assert versions == {package: FakeApt.VERSION for package in data.LIBREOFFICE_HELP_PACKAGES}
    assert fake.commands[:3] == [
        ["apt-get", "download"],
        ["apt-get", "update"],
        ["apt-get", "download"],
    ]
    assert fake.commands.count(["dpkg", "-x"]) == 3


def test_download_without_root_says_to_run_apt_get_update(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_run", FakeApt())
    monkeypatch.setattr(data.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(data.os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="sudo apt-get update"):
        data._download_and_extract(data.LIBREOFFICE_HELP_PACKAGES, tmp_path, lambda _m: None)


def test_download_needs_apt(tmp_path, monkeypatch):
    monkeypatch.setattr(data.shutil, "which", lambda tool: None)
    with pytest.raises(UserError, match="Debian or Ubuntu"):
        data._download_and_extract(data.LIBREOFFICE_HELP_PACKAGES, tmp_path, lambda _m: None)


def test_fetch_unknown_corpus_suggests_the_right_name(cache):
    with pytest.raises(UserError, match="did you mean 'libreoffice-help'"):
        data.fetch("libreoffice-halp")


def test_cli_fetch_and_list(fake_apt):
    from gates.cli.commands.data import data_app

    runner = CliRunner()
    result = runner.invoke(data_app, ["fetch", "libreoffice-help"])
    assert result.exit_code == 0, result.output
    assert "license: MPL-2.0" in result.output and "LICENSE.txt" in result.output
    assert "zh-en.tsv" in result.output and "pairs" in result.output
    assert "libreoffice-help:zh-en" in result.output
    again = runner.invoke(data_app, ["fetch", "libreoffice-help"])
    assert again.exit_code == 0 and "already present" in again.output
    listed = runner.invoke(data_app, ["list"])
    assert listed.exit_code == 0 and "libreoffice-help" in listed.output and "yes" in listed.output
    bad = runner.invoke(data_app, ["fetch", "libreofice-help"])
    assert isinstance(bad.exception, UserError) and "did you mean 'libreoffice-help'" in str(
        bad.exception
    )


# --- reading: registered corpora and users' own files -----------------------------------------------


def test_load_registered_sides(built):
    english = data.load_text("libreoffice-help:en")
    assert "Adds numbers." in english
    assert data.load_text("libreoffice-help:zh") == [
        s for s, _ in data.load_pairs("libreoffice-help:zh-en")
    ]
    assert ("Addiert Zahlen.", "Adds numbers.") in data.load_pairs("libreoffice-help:de-en")
    with pytest.raises(ValueError, match="load_pairs"):
        data.load_text("libreoffice-help:zh-en")
    with pytest.raises(ValueError, match="did you mean 'de'"):
        data.load_text("libreoffice-help:dee")
    assert data.check_source("libreoffice-help:en", kind="pairs") is not None
    assert data.check_source("libreoffice-help:zh-en", kind="pairs") is None


def test_user_txt_and_tsv(tmp_path):
    txt = tmp_path / "mine.txt"
    txt.write_bytes("\ufefffirst line\r\n\n  second\u2028still second  \nthird".encode("utf-8"))
    assert data.load_text(str(txt)) == ["first line", "second\u2028still second", "third"]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("hallo\thello\n\nWelt\tworld\textra column\n", encoding="utf-8")
    assert data.load_pairs(str(tsv)) == [("hallo", "hello"), ("Welt", "world")]
    assert data.load_text(str(tsv)) == ["hallo", "Welt"]
    bad = tmp_path / "bad.tsv"
    bad.write_text("ok\tfine\nno tab here\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: expected 'source<TAB>target'"):
        data.load_pairs(str(bad))
    with pytest.raises(ValueError, match="pairs need a .tsv"):
        data.load_pairs(str(txt))


def test_missing_user_file_is_a_clear_file_not_found(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=f"data file not found: {missing}"):
        data.load_text(str(missing))
    assert "data file not found" in data.check_source(str(missing))
    with pytest.raises(ValueError, match="unknown data source.*did you mean 'libreoffice-help:en'"):
        data.load_text("libreofice-help:en")


def test_moses_files(tmp_path):
    (tmp_path / "train.de").write_text("Hallo Welt\nGuten Tag\n\nEnde\n", encoding="utf-8")
    (tmp_path / "train.en").write_text(
        "Hello world\nGood day\nempty source\nEnd\n", encoding="utf-8"
    )
    source = f"moses:{tmp_path / 'train'}:de:en"
    assert data.load_pairs(source) == [
        ("Hallo Welt", "Hello world"),
        ("Guten Tag", "Good day"),
        ("Ende", "End"),
    ]
    assert data.check_source(source) is None
    assert data.load_text(str(tmp_path / "train.de")) == ["Hallo Welt", "Guten Tag", "Ende"]


def test_moses_line_count_mismatch_names_both_files(tmp_path):
    (tmp_path / "c.de").write_text("a\nb\nc\n")
    (tmp_path / "c.en").write_text("a\nb\n")
    source = f"moses:{tmp_path / 'c'}:de:en"
    with pytest.raises(ValueError) as info:
        data.load_pairs(source)
    message = str(info.value)
    assert f"{tmp_path / 'c.de'} has 3 lines" in message and f"{tmp_path / 'c.en'} has 2" in message
    assert "not line-aligned" in data.check_source(source)
    with pytest.raises(ValueError, match="PATH_PREFIX:SRC:TGT"):
        data.load_pairs("moses:only-prefix")


def test_source_fingerprint_follows_content_not_path(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one\n")
    before = data.source_fingerprint(str(path))
    assert before == hashlib.sha256(b"one\n").hexdigest()
    moved = tmp_path / "b.txt"
    moved.write_text("one\n")
    assert data.source_fingerprint(str(moved)) == before
    path.write_text("two\n")
    assert data.source_fingerprint(str(path)) != before
    (tmp_path / "m.de").write_text("x\n")
    (tmp_path / "m.en").write_text("y\n")
    moses = f"moses:{tmp_path / 'm'}:de:en"
    first = data.source_fingerprint(moses)
    (tmp_path / "m.en").write_text("z\n")
    assert data.source_fingerprint(moses) != first


def test_corpus_fingerprint_comes_from_the_manifest_and_differs_per_side(built, tmp_path):
    zh_en = data.source_fingerprint("libreoffice-help:zh-en")
    zh = data.source_fingerprint("libreoffice-help:zh")
    en = data.source_fingerprint("libreoffice-help:en")
    assert len({zh_en, zh, en}) == 3
    # rebuilding from different data changes it
    pages = {page: dict(langs) for page, langs in PAGES.items()}
    pages["scalc/01/sum.html"]["zh"] = [("p", "par_id9", "把数字加起来。")]
    root = write_help_tree(tmp_path / "changed", pages)
    data.build_from_extracted(root, built)
    assert data.source_fingerprint("libreoffice-help:zh-en") != zh_en
    assert data.source_fingerprint("libreoffice-help:en") == en  # English untouched


def test_gates_data_never_imports_torch():
    code = (
        "import sys, gates.models.corpora, gates.cli.commands.data; print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
