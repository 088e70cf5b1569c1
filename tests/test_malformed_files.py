"""Malformed files and I/O errors end in one line, never a traceback (issue #17, section 3).

Evidence of the wrong shape is one lost claim (verify, status, report, dashboard keep working for
the others); an unwritable runs/ folder or a kill between evidence.json and verdict.md never leaves a
pair that disagrees unnoticed; contract files are read with a real cap, never from a device or a
FIFO, and a control character, a bad seed or an unsafe arm name is refused at its line.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gates.cli import app
from gates.contract import load_contract
from gates.errors import UserError
from gates.record import EVIDENCE, REPORT, read_evidence, render_report, write_evidence
from gates.verify import check_claim, find_contracts, verify
from tests.conftest import small_c05, write_contract
from tests.helpers import gates

ROOT = Path(__file__).resolve().parent.parent
BROKEN, INTACT = "c05-structural-probe", "c05-structural-probe-hard"
GATES = [sys.executable, "-m", "gates"]
RUN = ("run", "contracts/c05-small.yaml", "--json")


def _memory_cap():  # a regression (reading /dev/zero to the end) must not take the machine down
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


@pytest.fixture
def project(make_project) -> Path:
    """contracts/ and runs/ with copies of two frozen committed claims (tests/fixtures/claims), indexed."""
    return make_project(claims=(BROKEN, INTACT))


def evidence_path(project: Path, contract_id: str = BROKEN) -> Path:
    return project / "runs" / contract_id / EVIDENCE


def _set(path: tuple, value):
    def edit(ev: dict):
        target = ev
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _values_a_number(ev: dict):
    term = next(iter(ev["conditions"][0]["values"]))
    ev["conditions"][0]["values"][term] = 5


CORRUPTIONS = {  # name -> (edit of the evidence dict, or the new file text; what verify names)
    "runs a string": (_set(("runs",), "all of them"), "malformed evidence: runs: "),
    "a metric a word": (
        _set(("runs", 0, "metrics", "test_acc"), "high"),
        "runs.0.metrics.test_acc",
    ),
    "a number where a list belongs": (_values_a_number, "conditions.0.values"),
    "seeds a number": (_set(("settings", "seeds"), 3), "settings.seeds"),
    "conditions an object": (_set(("conditions",), {"supported_if": []}), "conditions"),
    "truncated": (None, "unreadable evidence"),
}


def corrupt(project: Path, name: str) -> str:
    edit, needle = CORRUPTIONS[name]
    path = evidence_path(project)
    text = path.read_text()
    if edit is None:
        path.write_text(text[: len(text) // 2])
    else:
        ev = json.loads(text)
        edit(ev)
        path.write_text(json.dumps(ev, indent=2))
    return needle


def start_dashboard(project: Path):
    proc = subprocess.Popen(
        GATES + ["dashboard", "--port", "0", "--tracking-uri", f"sqlite:///{project / 'none.db'}"],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    match = re.search(r"serving (http://127\.0\.0\.1:\d+/)", line)
    if not match:
        proc.kill()
        pytest.fail(f"gates dashboard did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, match.group(1)


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


# ---------------------------------------------------------------------------------- evidence
@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_malformed_evidence_is_one_lost_claim_and_everything_else_works(project, name):
    intact_before = check_claim(
        evidence_path(project, INTACT), find_contracts(project / "contracts"), replay=False
    )
    needle = corrupt(project, name)
    runs, contracts = str(project / "runs"), str(project / "contracts")
    runner = CliRunner()

    done = runner.invoke(app, ["verify", "--runs-dir", runs, "--contracts-dir", contracts])
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit), done.output
    assert f"LOST {BROKEN}" in done.output and needle in done.output
    assert "restore the committed file from git" in done.output  # what to do
    checks = {c.contract_id: c for c in verify(project / "runs", project / "contracts")}
    assert checks[BROKEN].status == "lost" and checks[BROKEN].hash_ok is None
    assert checks[INTACT].status == "ok", checks[
        INTACT
    ].problems  # indexed by copy_claims: it holds
    intact_after = check_claim(
        evidence_path(project, INTACT), find_contracts(project / "contracts"), replay=False
    )
    assert intact_after.as_dict() == intact_before.as_dict()  # the other claim is checked as before

    done = runner.invoke(app, ["status", "--runs-dir", runs, "--contracts-dir", contracts])
    assert done.exit_code == 0 and done.exception is None, done.output
    assert "pending" not in done.output and "lost" in done.output  # never "pending, hash ok"

    done = runner.invoke(
        app,
        [
            "report",
            "--html",
            str(project / "report"),
            "--runs-dir",
            runs,
            "--contracts-dir",
            contracts,
            "--tracking-uri",
            f"sqlite:///{project / 'none.db'}",
        ],
    )
    assert done.exit_code == 0 and done.exception is None, done.output
    broken_page = (project / "report" / "contract" / f"{BROKEN}.html").read_text()
    assert "LOST" in broken_page and "Traceback" not in broken_page
    intact_page = (project / "report" / "contract" / f"{INTACT}.html").read_text()
    assert (
        "<h2>Conditions</h2>" in intact_page and "Traceback" not in intact_page
    )  # drawn from its evidence


def test_dashboard_pages_stay_up_with_malformed_evidence(project):
    corrupt(project, "runs a string")
    ev = json.loads(evidence_path(project, INTACT).read_text())
    ev["runs"][0]["metrics"]["test_acc"] = "high"
    evidence_path(project, INTACT).write_text(json.dumps(ev))
    proc, url = start_dashboard(project)
    try:
        for page in ("", f"contract/{BROKEN}", f"contract/{INTACT}"):
            status, html = fetch(url + page)
            assert status == 200 and "Traceback" not in html, (page, html[-3000:])
        status, html = fetch(url)
        assert html.count(">LOST<") == 2 and "evidence unreadable" in html
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_fifo_as_evidence_is_a_lost_claim_not_a_hang(project):
    path = evidence_path(project)
    path.unlink()
    os.mkfifo(path)  # no writer: reading it would wait for ever
    # the whole of `gates verify` (history and notes read the evidence too), not only check_claim
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gates",
            "verify",
            "--runs-dir",
            str(project / "runs"),
            "--contracts-dir",
            str(project / "contracts"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "unreadable evidence: a FIFO, not a regular file" in done.stdout


# ---------------------------------------------------------------------------------- writing
def _pair(folder: Path) -> tuple[bytes, bytes]:
    return (folder / EVIDENCE).read_bytes(), (folder / REPORT).read_bytes()


def _strays(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _newer(project: Path) -> dict:
    """The copied claim's evidence as a later run would record it (same verdict, another date)."""
    ev = json.loads(evidence_path(project).read_text())
    ev["created_at"] = "2030-01-01T00:00:00+00:00"
    return ev


def test_a_full_disk_leaves_the_old_pair_and_no_temporaries(project):
    folder = evidence_path(project).parent
    before = _pair(folder)
    ev = _newer(project)
    ev["padding"] = "x" * 50_000  # verdict.md fits under the cap, evidence.json does not
    (project / "new.json").write_text(json.dumps(ev))
    # a real process whose writes beyond 20 kB fail (RLIMIT_FSIZE: EFBIG, as a full disk fails them)
    script = textwrap.dedent(f"""
        import json, resource, signal, sys
        from pathlib import Path
        from gates.record import write_evidence
        from gates.errors import UserError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        try:
            write_evidence(Path({str(project / "runs")!r}),
                                  json.loads(Path({str(project / "new.json")!r}).read_text()))
        except UserError as e:
            print(e.render())
            sys.exit(2)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        done.stdout.count("\n") == 1
        and str(folder) in done.stdout
        and "expected a writable folder" in done.stdout
    )
    assert _pair(folder) == before and _strays(folder) == []


def test_an_unwritable_runs_folder_is_a_one_line_error_and_the_rerun_writes_it(tmp_path):
    (tmp_path / "contracts").mkdir()
    (tmp_path / "runs").mkdir()
    write_contract(tmp_path / "contracts", small_c05(), "c05-small.yaml")
    (tmp_path / "runs" / "c05-small").write_text(
        "in the way\n"
    )  # the folder cannot be made (root or not)
    done = gates(tmp_path, *RUN, preexec_fn=_memory_cap)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in done.stderr
    assert (
        "runs/c05-small: cannot write evidence.json and verdict.md here: it is not a folder"
        in errors[0]
    )
    (tmp_path / "runs" / "c05-small").unlink()
    done = gates(tmp_path, *RUN, preexec_fn=_memory_cap)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "runs" / "c05-small"
    ev = read_evidence(folder / EVIDENCE)
    assert (folder / REPORT).read_text() == render_report(ev)


KILL_AFTER_FIRST_RENAME = """
import json, os, signal
from pathlib import Path
from gates.record import write_evidence
real = os.replace
def replace(src, dst):  # a kill right after the first of the two files is in place
    real(src, dst)
    os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
write_evidence(Path({runs!r}), json.loads(Path({new!r}).read_text()))
"""


def test_a_kill_between_the_two_files_is_detected_and_the_next_write_repairs_it(project):
    folder = evidence_path(project).parent
    ev = _newer(project)
    (project / "new.json").write_text(json.dumps(ev))
    script = KILL_AFTER_FIRST_RENAME.format(
        runs=str(project / "runs"), new=str(project / "new.json")
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    written = read_evidence(folder / EVIDENCE)  # whole: old or new
    if (folder / REPORT).read_text() != render_report(written):  # the pair disagrees: detected
        result = check_claim(folder / EVIDENCE, find_contracts(project / "contracts"), replay=False)
        assert result.status == "lost"
        assert any("is not the rendering of its evidence.json" in p for p in result.problems), (
            result.problems
        )
    write_evidence(project / "runs", ev)  # the next run
    assert (folder / REPORT).read_text() == render_report(read_evidence(folder / EVIDENCE))
    assert _strays(folder) == []


def test_temporaries_of_a_killed_write_are_removed_by_the_next_write(project):
    folder = evidence_path(project).parent
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from gates.record._evidence import atomic_writer
        with atomic_writer(Path({str(folder / EVIDENCE)!r})) as f:
            f.write('{{"half": ')
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL and _strays(folder), done.stderr
    write_evidence(project / "runs", _newer(project))
    assert _strays(folder) == []
    subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    done = CliRunner().invoke(app, ["render", BROKEN, "--runs-dir", str(project / "runs")])
    assert done.exit_code == 0 and _strays(folder) == []


def test_gates_render_names_bad_evidence_in_one_line(project):
    corrupt(project, "runs a string")
    done = gates(project, "render", BROKEN, timeout=120, preexec_fn=_memory_cap)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "malformed evidence: runs" in done.stderr


# ---------------------------------------------------------------------------------- contract files
def test_gates_check_refuses_a_device_and_a_fifo(tmp_path):
    done = gates(tmp_path, "check", "/dev/zero", timeout=60, preexec_fn=_memory_cap)
    assert (
        done.returncode == 2
        and done.stderr
        == "error: /dev/zero: a device, not a regular file; expected a regular file\n"
    )
    fifo = tmp_path / "contract.yaml"
    os.mkfifo(fifo)
    # no writer: reading it would wait for ever
    done = gates(tmp_path, "check", str(fifo), timeout=60, preexec_fn=_memory_cap)
    assert (
        done.returncode == 2
        and done.stderr == f"error: {fifo}: a FIFO, not a regular file; expected a regular file\n"
    )
    done = gates(tmp_path, "check", str(tmp_path), timeout=60, preexec_fn=_memory_cap)
    assert done.returncode == 2 and "a folder, not a regular file" in done.stderr


def test_a_control_character_is_named_at_its_line(tmp_path):
    path = tmp_path / "c.yaml"
    text = (ROOT / "contracts" / "c05-structural-probe.yaml").read_text().splitlines(keepends=True)
    text[2] = text[2].rstrip("\n") + " \x01\n"
    path.write_text("".join(text))
    with pytest.raises(UserError) as info:
        load_contract(path)
    message = info.value.render()
    assert (
        message.startswith(f"{path}:3: invalid YAML: character U+0001 is not allowed")
        and "\n" not in message
    )


def _refused(tmp_path, data: dict) -> str:
    path = write_contract(tmp_path, data)
    with pytest.raises(UserError) as info:
        load_contract(path)
    return info.value.render()


@pytest.mark.parametrize(
    "seeds, expected",
    [
        ([0, -1], "seeds.1: value error, seed -1 is outside 0 <= seed < 2**31"),
        ([0, 2**31], "seeds.1: value error, seed 2147483648 is outside 0 <= seed < 2**31"),
        ([0, True], "seeds.1: input should be a valid integer, got True"),
        ([0, 1.0], "seeds.1: input should be a valid integer, got 1.0"),
        ([0, "1"], "seeds.1: input should be a valid integer, got '1'"),
    ],
)
def test_seeds_are_integers_every_study_can_use(tmp_path, seeds, expected):
    message = _refused(tmp_path, small_c05(seeds=seeds))
    assert (
        re.match(rf"{re.escape(str(tmp_path))}/contract\.yaml:\d+: ", message)
        and expected in message
    )


def test_the_largest_seed_loads(tmp_path):
    loaded = load_contract(write_contract(tmp_path, small_c05(seeds=[0, 1, 2**31 - 1])))
    assert loaded.contract.seeds == [0, 1, 2**31 - 1]


@pytest.mark.parametrize(
    "name", ["flat\naddress", "flat_address\n", "x" * 65, "arm/seed", "arm name", ""]
)
def test_arm_names_are_short_one_line_slugs(tmp_path, name):
    data = small_c05()
    data["arms"][name] = data["arms"]["flat_address"]
    assert "must be 1-64 letters, digits" in _refused(tmp_path, data)


def test_a_64_character_arm_name_loads(tmp_path):
    data = small_c05()
    data["arms"]["x" * 64] = data["arms"]["flat_address"]
    assert "x" * 64 in load_contract(write_contract(tmp_path, data)).arm_configs


def test_every_committed_contract_still_loads():
    paths = sorted((ROOT / "contracts").glob("*.yaml"))
    assert len(paths) >= 17
    for path in paths:
        load_contract(path)
