"""The claims history's entries read back as `IndexEntry` (gates/record/_index.py): every kind gates
writes parses into its typed fields with its line number and the JSON exactly as written (which
re-serialises to the line's bytes: the chain hashes those bytes), a hand-edited field reads as None and
marks the entry malformed, and a line that is not a JSON object is still a one-line ValueError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gates.record import (
    GENESIS,
    INDEX,
    IndexEntry,
    RerunRecord,
    latest_entries,
    record_entry,
)
from gates.record._index import index_entries, line_sha256, parse_index, read_index
from gates.record._writer import withdraw_claim

SHA = "ab" * 32
CERTIFIED = {
    "code_sha256": "cd" * 32,
    "code_files": {"models/toy.py": "ef" * 32},
    "reran": "1 of 1 completed runs",
    "tolerance": {"abs": 1e-6, "rel": 1e-6},
    "reran_runs": [{"arm": "a", "seed": 0, "metrics": {"acc": 0.5}}],
}


def evidence(runs: Path, cid: str) -> Path:
    path = runs / cid / "evidence.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"contract_id": cid, "contract_sha256": SHA, "verdict": "supported", "runs": []}
    path.write_text(json.dumps(record))
    return path


def every_kind(runs: Path) -> list[IndexEntry]:
    """One entry of each kind, in the order a claim's life writes them; what record_entry returned."""
    one, two = evidence(runs, "one"), evidence(runs, "two")
    return [
        record_entry(runs, one, "backfilled", "found"),
        record_entry(runs, one, "rederived", "engine 3", extra={"rederived_from": {"x": 1}}),
        record_entry(runs, one, "certified", "after a refactor", extra=CERTIFIED),
        withdraw_claim(runs, "one", "wrong corpus"),
        record_entry(runs, two, "recorded", ""),
    ]


def test_each_kind_round_trips_with_its_line_and_its_bytes(tmp_path):
    runs = tmp_path / "runs"
    written = every_kind(runs)
    lines = (runs / INDEX).read_bytes().splitlines()
    entries = read_index(runs)
    assert entries == written == index_entries(runs)  # what an append returns is what is read back
    assert [e.kind for e in entries] == [
        "backfilled",
        "rederived",
        "certified",
        "withdrawn",
        "recorded",
    ]
    assert [e.line for e in entries] == [1, 2, 3, 4, 5]
    prev = GENESIS
    for entry, line in zip(entries, lines):
        assert entry.data == json.loads(line) and not entry.malformed
        # gates' own separators: the parsed JSON re-serialises to the very bytes the chain hashed
        assert json.dumps(entry.data, ensure_ascii=False, separators=(", ", ": ")).encode() == line
        assert entry.prev == prev
        prev = line_sha256(line)
        assert IndexEntry.from_json(json.loads(line), entry.line) == entry
    backfilled, rederived, certified, withdrawn, recorded = entries
    assert backfilled.contract_id == "one" and backfilled.contract_sha256 == SHA
    assert backfilled.verdict == "supported" and backfilled.is_attempt and recorded.is_attempt
    assert backfilled.values_sha256 == rederived.values_sha256 is not None
    assert rederived.rederived_from == {"x": 1} and rederived.reason == "engine 3"
    assert (
        certified.code_sha256,
        certified.code_files,
        certified.reran,
        certified.tolerance,
        [r.as_dict() for r in certified.reran_runs],
    ) == tuple(CERTIFIED.values())
    # the re-runs are records, checked where the line is parsed
    assert certified.reran_runs == (RerunRecord(arm="a", seed=0, metrics={"acc": 0.5}),)
    assert withdrawn.evidence_sha256 is None and withdrawn.values_sha256 is None
    assert not (withdrawn.is_attempt or rederived.is_attempt or certified.is_attempt)
    assert latest_entries(runs) == {"one": withdrawn, "two": recorded}


def test_a_hand_edited_field_reads_as_none_and_marks_the_entry(tmp_path):
    runs = tmp_path / "runs"
    record_entry(runs, evidence(runs, "one"), "recorded", "")
    entry = json.loads((runs / INDEX).read_text())
    entry.update(time=5, code_files="x")
    (runs / INDEX).write_text(json.dumps(entry) + "\n")
    (read,) = read_index(runs)
    assert read.time is None and read.code_files is None and read.malformed
    assert read.data["time"] == 5  # the JSON as written stays readable
    _, problems = parse_index(runs)
    assert [p[1] for p in problems] == ["one"] and "time is 5; expected a string" in str(
        problems[0][2]
    )


def test_a_line_that_is_not_a_json_object_is_still_named(tmp_path):
    runs = tmp_path / "runs"
    record_entry(runs, evidence(runs, "one"), "recorded", "")
    with open(runs / INDEX, "ab") as f:
        f.write(b"[1, 2]\n")
    with pytest.raises(ValueError, match=r"line 2 is not a JSON object \(not a JSON object\)"):
        read_index(runs)
    entries, problems = parse_index(runs)
    assert [e.line for e in entries] == [1] and [p[:2] for p in problems] == [(2, None)]


def test_reran_runs_are_records_checked_where_the_line_is_parsed():
    """A certified entry's re-runs read as `RerunRecord`s; a list that is not what a certification
    writes reads as None (the entry is malformed: readers skip it), its JSON kept in `data`."""
    data = {"kind": "certified", **CERTIFIED}
    (run,) = IndexEntry.from_json(data, 1).reran_runs
    assert (run.arm, run.seed, run.metrics) == ("a", 0, {"acc": 0.5})
    assert run.as_dict() == CERTIFIED["reran_runs"][0]
    for wrong in ([{"arm": "a", "seed": "0", "metrics": {}}], [], "x"):
        entry = IndexEntry.from_json({**data, "reran_runs": wrong}, 1, malformed=True)
        assert entry.reran_runs is None and entry.data["reran_runs"] == wrong
    # empty only beside runs judged by the code the claim stood on (`gates certify`, other kernels)
    elsewhere = [{**CERTIFIED["reran_runs"][0], "commit": "a" * 40}]
    entry = IndexEntry.from_json({**data, "reran_runs": [], "reran_elsewhere": elsewhere}, 1)
    assert entry.reran_runs == () and entry.reran_elsewhere[0].commit == "a" * 40
    assert entry.reran_elsewhere[0].as_dict() == elsewhere[0]
