"""Evidence writes are atomic: a kill in the middle of a write leaves the old evidence intact."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

from gates.record import atomic_write_text, read_evidence


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "runs" / "x" / "evidence.json"
    atomic_write_text(path, '{"a": 1}')
    atomic_write_text(path, '{"a": 2}')
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["evidence.json"]


def test_kill_during_write_keeps_old_evidence(tmp_path):
    path = tmp_path / "evidence.json"
    path.write_text('{"verdict": "old"}')
    # a real process, really killed with SIGKILL half-way through writing the new evidence
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from gates.record._evidence import atomic_writer
        with atomic_writer(Path({str(path)!r})) as f:
            f.write('{{"verdict": "new", "runs": [')
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
            f.write(']}}')
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL
    assert json.loads(path.read_text()) == {"verdict": "old"}
    # the half-written temporary is hidden (dot-file) and never mistaken for evidence
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "evidence.json"]
    assert all(name.startswith(".evidence.json.") for name in leftovers)


def test_exception_during_write_discards_temporary(tmp_path):
    from gates.record._evidence import atomic_writer

    path = tmp_path / "evidence.json"
    try:
        with atomic_writer(path) as f:
            f.write("partial")
            raise RuntimeError("crash")
    except RuntimeError:
        pass
    assert list(tmp_path.iterdir()) == []


def test_read_evidence_rejects_malformed(tmp_path):
    import pytest

    path = tmp_path / "evidence.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        read_evidence(path)
    path.write_text('{"verdict": "supported"}')
    with pytest.raises(ValueError, match="lacks"):
        read_evidence(path)
