"""`gates new ID --study NAME`: a contract skeleton that `gates check` refuses, naming each placeholder
(FILE:LINE: field), until every one is replaced; then it checks like any contract."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gates.contract import MAX_CONTRACT_BYTES, Contract, load_yaml, placeholders
from gates.study import get_study
from tests.helpers import gates

# what a researcher would write in place of each placeholder (c05_probe, a few seconds per run)
FILLED = {
    "budget.steps": "60",
    "budget.eval_every": "20",
    "preflight.compute_cost.max_ratio": "2",
    "preflight.predicted_ablation.size": "0.5",
    "preflight.falsifiable_point.threshold": "0.9",
    "preflight.falsifiable_point.by_step": "60",
    "decision.supported_if.0.value": "0.9",
    "decision.refuted_if.0.value": "0.9",
    "factor.0": "features",
    "convergence.window": "20",
    "controls.0.value": "0.5",
}


def fill(path: Path) -> None:
    """Replace every placeholder, found the way `gates check` finds them, on the line it names."""
    data, lines = load_yaml(path, max_bytes=MAX_CONTRACT_BYTES)
    text = path.read_text().splitlines()
    for problem in placeholders(data, lines, str(path)):
        value = FILLED.get(problem.field, json.dumps(f"written by the test for {problem.field}"))
        text[problem.line - 1] = re.sub(r'"TODO:[^"]*"', value, text[problem.line - 1], count=1)
    path.write_text("\n".join(text) + "\n")


def test_new_check_refuses_placeholders_then_passes_when_filled(tmp_path):
    made = gates(tmp_path, "new", "my-claim", "--study", "c05_probe")
    assert made.returncode == 0, made.stderr
    path = tmp_path / "contracts" / "my-claim.yaml"
    text = path.read_text()
    assert "wrote contracts/my-claim.yaml" in made.stdout
    for gate in (
        "Gate 1",
        "Gate 2",
        "Gate 3",
        "Gate 4",
        "Gate 5",
    ):  # the five gates as prompts in comments
        assert re.search(rf"^\s*# {gate}, ", text, re.MULTILINE), gate

    data = yaml.safe_load(text)
    required = {name for name, f in Contract.model_fields.items() if f.is_required()}
    assert required <= set(data), required - set(data)  # every required field present
    defaults = get_study("c05_probe").Config().model_dump(mode="json")
    assert (
        data["arms"]["baseline"] == data["arms"]["variant"] == defaults
    )  # the study's defaults, every field
    assert data["study"] == "c05_probe" and data["id"] == "my-claim"
    # what today's design rules ask of a new contract, as prompts: seeds as a count, the factor under test, a
    # convergence rule (c05_probe trains), a positive control on the arm refuted_if asserts may fail
    assert (
        data["seeds"] == 8
        and "factor" in data
        and set(data["convergence"]) == {"metric", "window", "max_rel_improvement"}
    )
    assert [(c["arm"], c["control"]) for c in data["controls"]] == [("variant", "positive")]

    status = json.loads(gates(tmp_path, "status", "--json").stdout)
    assert [(r["id"], r["status"]) for r in status] == [("my-claim", "pending")]
    assert re.fullmatch(
        r"no evidence yet \(not run\); \d+ placeholders of `gates new` left \(`gates check` "
        r"names them\)",
        status[0]["problems"][0],
    )

    refused = gates(tmp_path, "check", "contracts/my-claim.yaml")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    errors = refused.stderr.strip().splitlines()
    found, lines = load_yaml(path, max_bytes=MAX_CONTRACT_BYTES)
    expected = placeholders(found, lines, "contracts/my-claim.yaml")
    assert len(errors) == len(expected) >= 10  # one line per placeholder
    for line, problem in zip(errors, expected):
        assert line.startswith(
            f"error: contracts/my-claim.yaml:{problem.line}: {problem.field}: still the "
            f'placeholder "TODO: '
        ), line
        assert text.splitlines()[problem.line - 1].count("TODO") == 1  # the line named holds it
    named = {line.split(": ")[2] for line in errors}
    assert {
        "claim",
        "source",
        "budget.steps",
        "preflight.falsifiable_point.threshold",
        "decision.supported_if.0.value",
        "decision.refuted_if.0.value",
    } <= named
    assert (
        gates(
            tmp_path,
            "run",
            "contracts/my-claim.yaml",
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}",
        ).returncode
        == 2
    )  # run refuses it too, before any store
    assert not (tmp_path / "mlflow.db").exists()

    fill(path)
    # `gates new` writes both arms with the study's defaults: one experiment run twice, which the design
    # rules refuse; the researcher changes what the arms differ in (the declared factor, features)
    same = gates(tmp_path, "check", "contracts/my-claim.yaml")
    assert (
        same.returncode == 2
        and "arm 'variant' has the same config as arm 'baseline'" in same.stderr
    )
    path.write_text(
        path.read_text().replace('features: "subheap_kernel"', 'features: "path_only"', 1)
    )
    partly = path.read_text()
    path.write_text(
        partly.replace("by_step: 60", 'by_step: "TODO: later"')
    )  # one left: named alone
    one = gates(tmp_path, "check", "contracts/my-claim.yaml")
    assert one.returncode == 2
    assert one.stderr.strip().splitlines() == [
        f"error: contracts/my-claim.yaml:{partly.splitlines().index('    by_step: 60') + 1}: "
        f'preflight.falsifiable_point.by_step: still the placeholder "TODO: later" that `gates new` wrote; '
        f"expected your value"
    ]
    path.write_text(partly)
    checked = gates(tmp_path, "check", "contracts/my-claim.yaml")
    assert checked.returncode == 0, checked.stderr
    assert (
        "ready to run" in checked.stdout
        and "gate 5 falsifiable point: variant.test_acc >= 0.9" in checked.stdout
    )


def test_new_refuses_an_existing_file_an_invalid_id_and_an_unknown_study(tmp_path):
    (tmp_path / "contracts").mkdir()
    existing = tmp_path / "contracts" / "taken.yaml"
    existing.write_text("id: taken\n")
    elsewhere = tmp_path / "contracts" / "old-name.yaml"
    elsewhere.write_text("id: also-taken\nclaim: x\n")
    cases = {
        ("taken",): "error: ID: contracts/taken.yaml already exists; expected a new id",
        ("also-taken",): "error: ID: contracts/old-name.yaml already has id 'also-taken'",
        ("Not_An_Id",): "error: ID: 'Not_An_Id' is not a contract id; expected lowercase letters",
        ("../escape",): "error: ID: '../escape' is not a contract id",
        (
            "ok-id",
            "c05_prob",
        ): "error: --study: unknown study 'c05_prob' (did you mean 'c05_probe'?)",
    }
    for args, message in cases.items():
        contract_id, study = (args + ("c05_probe",))[:2]
        done = gates(tmp_path, "new", contract_id, "--study", study)
        assert done.returncode == 2, (args, done.stdout)
        assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr
    assert existing.read_text() == "id: taken\n"  # never overwritten
    assert sorted(p.name for p in (tmp_path / "contracts").iterdir()) == [
        "old-name.yaml",
        "taken.yaml",
    ]


@pytest.mark.parametrize(
    "value,is_placeholder",
    [
        ("TODO", True),
        ("TODO: x", True),
        ("  TODO: x", True),
        ("TODO:", True),
        ("TODOS are done", False),
        ("not TODO: x", False),
        ("todo: x", False),
    ],
)
def test_what_counts_as_a_placeholder(value, is_placeholder):
    data = {"claim": value, "arms": {"a": {"x": [1, value]}}}
    found = placeholders(data, {("claim",): 3}, "c.yaml")
    assert len(found) == (2 if is_placeholder else 0)
    if is_placeholder:
        assert found[0].render().startswith("c.yaml:3: claim: still the placeholder")
        assert found[1].field == "arms.a.x.1"
