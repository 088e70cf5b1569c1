"""A command reads a claim's files once: planning a run's recording (`plan_recording`, before any
training) parses the claims history once and reads the claim's evidence once, for its record and the
hash the history vouches for."""

from __future__ import annotations

import collections
from pathlib import Path

import gates.contract._yaml as yaml_files
import gates.record._attempts as attempts
import gates.record._index as index
from gates.contract import load_contract
from gates.record import plan_recording
from tests.conftest import copy_claims

CLAIM = "c05-structural-probe"


def test_planning_a_recording_reads_the_claims_files_once(tmp_path, monkeypatch):
    root = copy_claims(tmp_path, CLAIM)
    loaded = load_contract(root / "contracts" / f"{CLAIM}.yaml")
    reads, parses = collections.Counter(), collections.Counter()
    read_capped, entries = yaml_files.read_capped, index.parse_index

    def counted_read(path, max_bytes):
        reads[Path(path).name] += 1
        return read_capped(path, max_bytes)

    def counted_parse(runs_root):
        parses[Path(runs_root).name] += 1
        return entries(runs_root)

    for module in (index, attempts):
        monkeypatch.setattr(module, "read_capped", counted_read)
    monkeypatch.setattr(index, "parse_index", counted_parse)
    recording = plan_recording(loaded, root / "runs")
    assert recording.mode == "reproduce" and recording.recorded.contract_id == CLAIM
    assert reads == {"INDEX.jsonl": 1, "evidence.json": 1}
    assert parses == {"runs": 1}
