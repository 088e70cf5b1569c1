"""Evidence as typed records (gates.record.Evidence): frozen, read through a format migration, written
back byte for byte; what the runner writes is the JSON it wrote when evidence was a dict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from gates.contract import load_contract
from gates.entities import RunRecord
from gates.record import (
    EVIDENCE_FORMAT,
    Evidence,
    read_evidence,
    render_report,
    write_evidence,
)
from gates.record._evidence import _migrate
from tests.conftest import FIXTURE_CLAIMS, FIXTURE_RUNS, small_c05, write_contract

FIXTURE = FIXTURE_RUNS / "c05-structural-probe" / "evidence.json"


def _written(ev: Evidence) -> str:
    return json.dumps(ev.as_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n"


# ---------------------------------------------------------------------------------- older evidence
@pytest.mark.parametrize("contract_id", FIXTURE_CLAIMS)
def test_committed_older_evidence_reads_and_writes_back_the_same_bytes(contract_id):
    """The frozen claims (verdict engine 2, recorded before attempts, per-file code hashes, devices and
    controls were): they read, the fields they lack come from the records' defaults, and the record
    gives back their JSON key for key, in order (ints stay ints)."""
    path = FIXTURE_RUNS / contract_id / "evidence.json"
    ev = read_evidence(path)
    assert isinstance(ev, Evidence) and ev.format == EVIDENCE_FORMAT
    assert _written(ev) == path.read_text()
    assert ev.as_dict() == json.loads(path.read_text())
    assert all(isinstance(r, RunRecord) for r in ev.runs)


def test_fields_older_evidence_lacks_read_as_their_defaults():
    raw = json.loads(FIXTURE.read_text())
    assert not {"attempt", "code_files", "controls", "supersedes", "not_run"} & set(raw)
    ev = read_evidence(FIXTURE)
    assert ev.attempt is None and ev.code_files is None and ev.supersedes is None
    assert ev.controls == [] and ev.not_run == [] and ev.tuning_edges == {}
    assert not ev.has("supersedes") and ev.has("claim")
    assert ev.runs[0].environment is None and not ev.runs[0].has("converged")
    assert ev.engine_version == raw["engine_version"] == "2"
    without = Evidence.of({k: v for k, v in raw.items() if k != "engine_version"})
    assert without.engine_version == "1"  # before engines were numbered


# ---------------------------------------------------------------------------------- the format
def test_the_migration_brings_evidence_without_a_format_up_to_the_current_one(tmp_path):
    raw = json.loads(FIXTURE.read_text())
    current = dict(raw)
    assert _migrate(current) is current  # the current format: the data itself
    for absent in ({k: v for k, v in raw.items() if k != "format"}, {**raw, "format": None}):
        migrated = _migrate(dict(absent))
        assert migrated["format"] == EVIDENCE_FORMAT == 1
        assert list(migrated)[0] == "format"  # the first key, where every writer puts it
        assert {k: v for k, v in migrated.items() if k != "format"} == {
            k: v for k, v in raw.items() if k != "format"
        }
    path = tmp_path / "evidence.json"
    path.write_text(json.dumps({k: v for k, v in raw.items() if k != "format"}, indent=2))
    ev = read_evidence(path)
    assert ev.format == 1 and ev.has("format") and ev == read_evidence(FIXTURE)


def test_a_newer_or_unknown_format_is_refused_in_one_line(tmp_path):
    raw = json.loads(FIXTURE.read_text())
    path = tmp_path / "evidence.json"
    path.write_text(json.dumps({**raw, "format": EVIDENCE_FORMAT + 1}))
    with pytest.raises(ValueError, match="format 2, newer than this gates reads .1.; .*upgrade"):
        read_evidence(path)
    path.write_text(json.dumps({**raw, "format": -1}))
    with pytest.raises(ValueError, match="unknown format -1"):
        read_evidence(path)
    path.write_text(json.dumps({**raw, "format": "1"}))  # no integer: the schema names it
    with pytest.raises(ValueError, match="malformed evidence: format: input should be a valid int"):
        read_evidence(path)


# ---------------------------------------------------------------------------------- frozen records
def test_records_are_frozen():
    ev = read_evidence(FIXTURE)
    with pytest.raises(ValidationError, match="frozen"):
        ev.verdict = "supported"
    with pytest.raises(ValidationError, match="frozen"):
        ev.runs[0].seed = 7
    with pytest.raises(ValidationError, match="frozen"):
        ev.settings.alpha = 0.5
    with pytest.raises(ValidationError, match="frozen"):
        ev.new_field = 1
    assert ev.verdict == read_evidence(FIXTURE).verdict


def test_records_compare_by_data_whatever_the_order_of_their_keys():
    raw = json.loads(FIXTURE.read_text())
    reordered = dict(reversed(list(raw.items())))
    assert Evidence.of(reordered) == Evidence.of(raw)
    assert list(Evidence.of(reordered).as_dict()) == list(reordered)
    assert Evidence.of({**raw, "verdict": "refuted"}) != Evidence.of(raw)


def test_a_revised_record_keeps_its_keys_in_place_and_is_checked():
    """The verdict engine settles a condition in steps, each a revised copy of a frozen record: the
    copy writes its keys where the original had them (a new one last) and is checked as a new one."""
    condition = read_evidence(FIXTURE).conditions[0]
    revised = condition.revised(outcome="undetermined", note="lost", extra_key=1)
    assert list(revised.as_dict()) == [*condition.as_dict(), "extra_key"]
    assert (revised.outcome, revised.note, condition.label) == (
        "undetermined",
        "lost",
        f"{condition.list_name}[{condition.index}]",
    )
    assert condition.revised() == condition and condition.revised() is not condition
    with pytest.raises(ValidationError):
        condition.revised(outcome="maybe")


# ---------------------------------------------------------------------------------- writing back
def test_unknown_keys_survive_a_read_and_a_write(tmp_path):
    """Keys from a newer (or older) writer, at the top and inside a run and a condition, are kept where
    they were: evidence read and written again is the same bytes."""
    raw = json.loads(FIXTURE.read_text())
    data = {}
    for key, value in raw.items():
        data[key] = value
        if key == "verdict":
            data["from_a_newer_writer"] = {"x": [1, 2.5, None]}
    data["runs"] = [{**raw["runs"][0], "extra": 1}] + raw["runs"][1:]
    data["conditions"] = [{"note_v9": "kept", **raw["conditions"][0]}] + raw["conditions"][1:]
    source = tmp_path / "source.json"
    source.write_text(json.dumps(data, indent=2) + "\n")
    ev = read_evidence(source)
    assert ev.from_a_newer_writer == {"x": [1, 2.5, None]} and ev.runs[0].extra == 1
    written = write_evidence(tmp_path / "runs", ev)
    assert written.read_text() == source.read_text()
    assert (written.parent / "verdict.md").read_text() == render_report(ev)


def test_an_int_stays_an_int():
    raw = json.loads(FIXTURE.read_text())
    condition = {**raw["conditions"][0], "estimate": 3, "ci_low": 1}
    ev = Evidence.of({**raw, "conditions": [condition] + raw["conditions"][1:]})
    assert ev.conditions[0].estimate == 3 and type(ev.conditions[0].estimate) is int
    assert '"estimate": 3,' in _written(ev)
    with pytest.raises(ValueError, match="estimate: input should be a valid number, got True"):
        Evidence.of({**raw, "conditions": [{**condition, "estimate": True}]})


def test_evidence_of_checks_what_it_is_given():
    raw = json.loads(FIXTURE.read_text())
    with pytest.raises(ValueError, match="evidence lacks runs"):
        Evidence.of({k: v for k, v in raw.items() if k != "runs"})
    with pytest.raises(ValueError, match="not JSON data"):
        Evidence.of({**raw, "created_at": float("nan")})
    # tuples and other JSON-serialisable values: as evidence.json would hold them
    ev = Evidence.of({**raw, "reasons": tuple(raw["reasons"])})
    assert ev.reasons == raw["reasons"] and isinstance(ev.reasons, list)


# ---------------------------------------------------------------------------------- the runner
@pytest.mark.usefixtures("one_thread")
def test_the_runner_writes_the_json_of_the_evidence_it_builds(tmp_path, monkeypatch):
    """`gates run` builds the evidence's data (unchanged since evidence was a dict), checks it into an
    Evidence and writes that: evidence.json is exactly `json.dumps` of the data built (what was written
    when the runner wrote the dict), key order included; `run_contract` returns the Evidence."""
    from gates.record import _derive
    from tests.helpers import run_contract

    built = []

    class Spy(Evidence):
        @classmethod
        def of(cls, data):
            built.append(json.loads(json.dumps(data)))
            return Evidence.of(data)

    monkeypatch.setattr(_derive, "Evidence", Spy)  # the one derivation builds every Evidence
    (tmp_path / "contracts").mkdir()
    write_contract(tmp_path / "contracts", small_c05(), "c05-small.yaml")
    monkeypatch.chdir(tmp_path)
    ev = run_contract(
        load_contract("contracts/c05-small.yaml"),
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        Path("runs"),
    )
    (data,) = built
    path = tmp_path / "runs" / "c05-small" / "evidence.json"
    assert path.read_text() == json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n"
    assert isinstance(ev, Evidence) and ev == read_evidence(path)
    assert list(data)[:3] == ["format", "contract_id", "contract_path"]
    assert (path.parent / "verdict.md").read_text() == render_report(data)
