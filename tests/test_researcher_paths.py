"""The researcher's three paths without a leak (issue #42): `gates verify` fails on a contract of the
folder that `gates check` refuses (and counts as holding only claims with evidence), `gates status`
answers one line per claim within 80 columns and for the claims asked, the messages of check and run
say what is accepted and where, and a study's error is said at the study's own line, not torch's."""

from __future__ import annotations

import re
import sys

import pytest
from typer.testing import CliRunner

from gates.cli import app
from gates.errors import UserError
from tests.conftest import copy_claims, small_c05, write_contract
from tests.helpers import gates

RECORDED = "c05-structural-probe-hard"


def _line_of(path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# ---------------------------------------------------------------------------------- verify
@pytest.fixture
def project(make_project):
    """One recorded claim (a frozen copy), a contract ready to run, and four that `gates check`
    refuses: a typo'd arm, seeds as a string, an unknown study, broken YAML."""
    root = make_project(claims=(RECORDED,))
    contracts = root / "contracts"
    write_contract(contracts, small_c05(id="ready"), "ready.yaml")
    typo = small_c05(id="typo")
    typo["decision"]["supported_if"][0]["arm"] = "subheap_kernl"
    write_contract(contracts, typo, "typo.yaml")
    write_contract(contracts, small_c05(id="bad-seeds", seeds="5"), "bad-seeds.yaml")
    write_contract(contracts, small_c05(id="bad-study", study="c05_prob"), "bad-study.yaml")
    (contracts / "broken-yaml.yaml").write_text("id: broken-yaml\nclaim: [not closed\n")
    return root


def test_verify_fails_on_each_contract_that_does_not_check(project):
    done = gates(project, "verify")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    contracts = project / "contracts"
    expected = {
        "typo": f"contracts/typo.yaml:{_line_of(contracts / 'typo.yaml', 'subheap_kernl')}: "
        "decision.supported_if.0.arm: no arm named 'subheap_kernl'",
        "bad-seeds": f"contracts/bad-seeds.yaml:{_line_of(contracts / 'bad-seeds.yaml', 'seeds:')}: "
        "seeds: ",
        "bad-study": f"contracts/bad-study.yaml:{_line_of(contracts / 'bad-study.yaml', 'study:')}: "
        "study: unknown study 'c05_prob'",
        "broken-yaml": "contracts/broken-yaml.yaml:3: invalid YAML: ",
    }
    for contract_id, problem in expected.items():
        at = lines.index(f"BROKEN {contract_id}: does not check")
        assert lines[at + 1].strip().startswith(problem), lines[at : at + 3]
        assert not lines[at + 2].startswith("    contracts/"), "one line per refusal"
    # the same words as `gates check` (one implementation)
    check = gates(project, "check", "contracts/typo.yaml")
    at = lines.index("BROKEN typo: does not check")
    assert check.returncode == 2 and check.stderr.strip() == f"error: {lines[at + 1].strip()}"
    assert "pending ready: -" in lines  # checks: pending, no problem
    assert lines[-1] == (
        "1 of 1 claims hold their evidence; 1 pending (no evidence yet); 4 contracts do not check: "
        "bad-seeds, bad-study, broken-yaml, typo"
    )


def test_verify_holds_with_only_contracts_that_check(project):
    for name in ("typo", "bad-seeds", "bad-study", "broken-yaml"):
        (project / "contracts" / f"{name}.yaml").unlink()
    done = gates(project, "verify", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    text = gates(project, "verify")
    assert text.stdout.splitlines()[-1] == (
        "1 of 1 claims hold their evidence; 1 pending (no evidence yet)"
    )


# ---------------------------------------------------------------------------------- status
IDS = ("c05-structural-probe", "c05-structural-probe-v2", "c05-sequential-early")


def test_status_is_one_line_per_claim_within_80_columns_and_for_the_claims_asked(tmp_path):
    root = copy_claims(tmp_path, *IDS)
    done = gates(root, "status", columns=80)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if len(line) > 80] == []
    claims = [line for line in lines if line.split()[:1] and line.split()[0] in IDS]
    assert [line.split()[0] for line in claims] == sorted(IDS)  # each once, in one line
    assert re.match(
        r"c05-structural-probe\s+inconclusive \(superseded\)\s+\d{4}-\d\d-\d\d\s+ok", claims[1]
    )
    assert "superseded by" not in done.stdout and "gates status -v" in done.stdout

    one = gates(root, "status", "c05-structural-probe-v2", columns=80)
    assert [line.split()[0] for line in one.stdout.splitlines() if line.startswith("c05-")] == [
        "c05-structural-probe-v2"
    ]
    glob = gates(root, "status", "c05-structural-*", columns=80)
    assert [line.split()[0] for line in glob.stdout.splitlines() if line.startswith("c05-")] == [
        "c05-structural-probe",
        "c05-structural-probe-v2",
    ]
    details = gates(root, "status", "c05-structural-probe", "-v", columns=80)
    assert "superseded by c05-structural-probe-v2" in details.stdout
    assert [line for line in details.stdout.splitlines() if len(line) > 80] == []
    unknown = gates(root, "status", "c05-structural-prob", columns=80)
    assert unknown.returncode == 2 and unknown.stderr.startswith(
        "error: ids: no claim matches 'c05-structural-prob' (did you mean 'c05-structural-probe'?)"
    )
    assert len(unknown.stderr.splitlines()) == 1


def test_status_json_for_the_claims_asked(tmp_path):
    import json

    root = copy_claims(tmp_path, *IDS)
    done = gates(root, "status", "c05-seq*", "--json")
    assert [row["id"] for row in json.loads(done.stdout)] == ["c05-sequential-early"]


# ---------------------------------------------------------------------------------- messages
def test_seeds_as_a_string_names_the_accepted_forms(workdir):
    path = write_contract(workdir / "contracts", small_c05(id="s", seeds="5"), "s.yaml")
    done = CliRunner().invoke(app, ["check", str(path)])
    assert isinstance(done.exception, UserError)  # main() says it in a line each, exit 2
    message = str(done.exception)
    assert message.startswith(f"{path}:{_line_of(path, 'seeds:')}: seeds: ")
    assert (
        "expected a count (seeds: 5 runs seeds 0..4)" in message
        and "list of distinct ints" in message
    )
    assert "got '5'" in message


def test_an_undeclared_difference_is_said_at_the_arm_value_s_line(workdir):
    data = small_c05(id="d")
    data["arms"]["path_only"]["lr"] = 0.5  # differs from the other arms; `differences` not written
    path = write_contract(workdir / "contracts", data, "d.yaml")
    done = CliRunner().invoke(app, ["check", str(path)])
    assert isinstance(done.exception, UserError)  # main() says it in a line each, exit 2
    (line,) = [line for line in str(done.exception).splitlines() if "differ in 'lr'" in line]
    assert line.startswith(f"{path}:{_line_of(path, 'lr: 0.5')}: differences: ")


def test_check_refuses_a_contract_outside_the_contracts_folder_as_run_does(workdir):
    outside = write_contract(workdir, small_c05(id="elsewhere"), "elsewhere.yaml")
    said = []
    for command in ("check", "run"):
        done = gates(workdir, command, str(outside))
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        said.append(done.stderr)
    assert said[0] == said[1] and "outside the project's contracts folder contracts/" in said[0]
    inside = write_contract(workdir / "contracts", small_c05(id="inside"), "inside.yaml")
    assert CliRunner().invoke(app, ["check", str(inside)]).exit_code == 0


def test_check_counts_and_names_the_ways_to_refute(workdir):
    data = small_c05(id="w")
    data["decision"]["supported_if"] = data["decision"]["supported_if"][:2]
    data["decision"]["refuted_if"] = data["decision"]["refuted_if"][:1]
    path = write_contract(workdir / "contracts", data, "w.yaml")
    done = CliRunner().invoke(app, ["check", str(path)])
    assert done.exit_code == 0, done.output
    decision = " ".join(line for line in done.output.splitlines() if line.startswith("decision:"))
    assert (
        "2 supported_if (all must hold: each tested at alpha), 1 refuted_if; 3 ways to refute "
        "(1 refuted_if holding, 2 supported_if failing), Holm-corrected at alpha" in decision
    )
    # a claim of one condition (no check passes one here)
    from gates.cli._printers import ways_to_refute

    assert ways_to_refute(1, 0) == "one way to refute (the supported_if failing), tested at alpha"


# ---------------------------------------------------------------------------------- a study's error
TORCHY = """\
import torch


class TorchyStudy:
    def run(self):
        layer = torch.nn.Linear(3, 2)
        return layer(torch.zeros(1, 5))  # the study's own line: a shape torch refuses
"""


def test_a_study_s_error_is_said_at_its_own_line_not_torch_s(tmp_path, monkeypatch):
    from gates.execution._study_run import study_error

    (tmp_path / "torchy_study.py").write_text(TORCHY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchy_study", raising=False)
    import torchy_study

    study = torchy_study.TorchyStudy()
    with pytest.raises(RuntimeError) as info:
        study.run()
    innermost = info.traceback[-1].path  # where it raised: in torch
    assert "torch" in str(innermost)
    error = study_error(info.value, study)
    assert error["where"] == "torchy_study.py:7"  # `return layer(...)`, not torch's linear.py
    assert error["type"] == "RuntimeError" and "cannot be multiplied" in error["message"]
