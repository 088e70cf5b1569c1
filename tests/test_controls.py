"""Controls (issue #11): conditions that must hold for an experiment to be interpretable; one that
fails or cannot be settled makes the verdict `invalid`, whatever the decision says."""

from __future__ import annotations

import pytest
import yaml

from gates.cli import check
from gates.contract import Contract, Decision, load_contract
from gates.design import require_current_rules, rule_flags
from gates.errors import UserError
from gates.inference import decide, holm
from gates.record import render_report
from tests.conftest import C05, c05_current, write_contract
from tests.test_verdict import runs, thr

WINS = {
    "kind": "compare",
    "arm": "tree",
    "metric": "nll",
    "other": "dense",
    "direction": "lower",
    "margin": 0.1,
}
BASELINE_WORKS = {
    "kind": "compare",
    "arm": "dense",
    "metric": "nll",
    "other": "no_source",
    "direction": "lower",
    "margin": 0.5,
    "control": "positive",
}


def decision(supported, refuted=None) -> Decision:
    """A decision whose default refuted_if never holds and reads an arm that ran (engine 3: an arm the
    decision reads without a completed run makes the verdict invalid)."""
    arm, metric = supported[0]["arm"], supported[0]["metric"]
    never = thr(arm, metric, "higher", 1e9)
    return Decision.model_validate({"supported_if": supported, "refuted_if": refuted or [never]})


def controls(*items):
    """Controls validated as a contract would validate them."""
    data = yaml.safe_load(C05.read_text())
    data["controls"] = list(items)
    return Contract.model_validate(data).controls


def experiment(dense_nll, no_source_nll):
    return (
        runs("tree", nll=[3.51, 3.48, 3.53, 3.47, 3.50])
        + runs("dense", nll=dense_nll)
        + runs("no_source", nll=no_source_nll)
    )


def test_a_working_baseline_leaves_the_decision_to_decide():
    v = decide(
        decision([WINS]),
        experiment([3.91, 3.88, 3.95, 3.90, 3.86], [5.01, 4.97, 5.05, 4.99, 5.02]),
        controls=controls(BASELINE_WORKS),
    )
    assert v.verdict == "supported"
    (c,) = v.controls
    assert (c.list_name, c.control, c.outcome) == ("controls", "positive", "holds")


def test_a_broken_baseline_makes_the_verdict_invalid_not_supported():
    """The tree 'wins' by 0.4 NLL, but the dense baseline is no better than reading no source at all."""
    broken = experiment([4.99, 5.03, 5.00, 4.98, 5.04], [5.01, 4.97, 5.05, 4.99, 5.02])
    assert (
        decide(decision([WINS]), broken).verdict == "supported"
    )  # without the control: a false win
    v = decide(decision([WINS]), broken, controls=controls(BASELINE_WORKS))
    assert v.verdict == "invalid"
    assert v.conditions[0].outcome == "holds"  # the decision alone would have said supported
    assert "controls[0] (positive control) fails" in v.reasons[0]


def test_an_unsettled_control_is_invalid_too():
    noisy = experiment([3.9, 5.1, 4.2, 4.9, 3.7], [5.01, 4.97, 5.05, 4.99, 5.02])
    v = decide(decision([WINS]), noisy, controls=controls(BASELINE_WORKS))
    assert v.verdict == "invalid" and v.controls[0].outcome == "undetermined"
    assert "cannot be settled" in v.reasons[0] and v.settle


def test_a_negative_control_must_hold_as_written():
    """A random topology must not pass the criterion: written as the condition that it stays above."""
    random_fails = {
        "kind": "threshold",
        "arm": "random",
        "metric": "kl",
        "direction": "higher",
        "value": 0.5,
        "control": "negative",
    }
    good = runs("tree", kl=[0.11, 0.12, 0.13]) + runs("random", kl=[0.91, 0.95, 0.93])
    d = decision([thr("tree", "kl", "lower", 0.2)])  # its refuted_if: tree.kl >= 1e9, never
    assert decide(d, good, controls=controls(random_fails)).verdict == "supported"
    passes_too = runs("tree", kl=[0.11, 0.12, 0.13]) + runs("random", kl=[0.12, 0.14, 0.13])
    v = decide(d, passes_too, controls=controls(random_fails))
    assert v.verdict == "invalid" and v.controls[0].control == "negative"


def test_controls_have_their_own_holm_family():
    """Adding controls does not make the decision's conditions harder to pass, and vice versa. Engine 3:
    every control must hold, an intersection-union test at alpha (p(hold) unadjusted); a control fails in
    the controls' own Holm family."""
    data = experiment([3.91, 3.88, 3.95, 3.90, 3.86], [5.01, 4.97, 5.05, 4.99, 5.02])
    alone = decide(decision([WINS]), data)
    weak = {**BASELINE_WORKS, "margin": 1.5}  # dense only 1.09 below no_source: fails
    with_controls = decide(decision([WINS]), data, controls=controls(BASELINE_WORKS, weak))
    assert with_controls.conditions[0].p_hold_adj == alone.conditions[0].p_hold_adj
    assert with_controls.conditions[0].p_fail_adj == alone.conditions[0].p_fail_adj
    works, broken = with_controls.controls
    assert (works.p_hold_adj, broken.p_hold_adj) == (works.p_hold, broken.p_hold)
    assert [works.p_fail_adj, broken.p_fail_adj] == pytest.approx(
        holm([works.p_fail, broken.p_fail])
    )
    assert broken.p_fail_adj == pytest.approx(
        min(1.0, 2 * broken.p_fail)
    )  # the smaller of 2 raw p(fail)
    assert (
        "intersection-union" in works.adjustment and "Holm over the 2 controls" in works.adjustment
    )
    assert (works.outcome, broken.outcome, with_controls.verdict) == ("holds", "fails", "invalid")
    # two controls that hold: each at alpha, neither made harder by the other
    both = decide(decision([WINS]), data, controls=controls(BASELINE_WORKS, BASELINE_WORKS))
    assert [c.p_hold_adj for c in both.controls] == [
        works.p_hold,
        works.p_hold,
    ] and both.verdict == "supported"


def test_a_lost_run_keeps_a_control_from_holding():
    data = experiment([3.91, 3.88, 3.95, 3.90], [5.01, 4.97, 5.05, 4.99, 5.02])
    data += runs("dense", seeds=[4], status="failed")
    v = decide(decision([WINS]), data, controls=controls(BASELINE_WORKS))
    assert v.verdict == "invalid" and "lost" in v.controls[0].note


def test_verdict_md_shows_the_controls():
    v = decide(
        decision([WINS]),
        experiment([4.99, 5.03, 5.00, 4.98, 5.04], [5.01, 4.97, 5.05, 4.99, 5.02]),
        controls=controls(BASELINE_WORKS),
    ).to_dict()
    ev = {
        "contract_id": "x",
        "contract_sha256": "0" * 64,
        "verdict": v["verdict"],
        "git_commit": "0" * 40,
        "git_dirty": "false",
        "code_sha256": "0" * 64,
        "created_at": "now",
        "runs": [],
        "reasons": v["reasons"],
        "conditions": v["conditions"],
        "controls": v["controls"],
        "settings": {
            "alpha": 0.05,
            "evaluation": "interval",
            "correction": "iut+holm",
            "seeds": [0],
            "budget": {"steps": 10, "eval_every": 5},
            "arm_configs": {},
        },
    }
    text = render_report(ev)  # JSON data of evidence: checked into an Evidence first
    assert "**INVALID**" in text and "## Controls" in text and "| positive | **fails** |" in text


def test_a_compare_decision_needs_a_positive_control_on_its_baseline(tmp_path):
    # the C05 contract as today's design rules want it, then changed; path_only (449 parameters, 832 FLOPs)
    # costs more than subheap_kernel (257, 448): a claim to beat it is one at matched cost (rule compute)
    data = c05_current()
    data["id"] = "c05-compare"
    data["decision"]["supported_if"] = [
        {
            "kind": "compare",
            "arm": "subheap_kernel",
            "metric": "test_acc",
            "other": "path_only",
            "direction": "higher",
            "margin": 0.5,
        }
    ]
    data["decision"]["refuted_if"] = [
        {
            "kind": "compare",
            "arm": "subheap_kernel",
            "metric": "test_acc",
            "other": "path_only",
            "direction": "lower",
            "margin": -0.1,
        }
    ]
    data["seeds"] = 8
    del data["blind"]["path_only"]  # neither blind nor shown to work
    path = write_contract(tmp_path, data)
    with pytest.raises(UserError) as info:
        check(path, runs_dir=tmp_path / "runs", contracts_dir=path.parent, as_json=False)
    out = info.value.render()
    assert (
        "decision.supported_if.0: compares with baseline arm 'path_only', but no positive control asserts "
        "that it works where it can" in out
    )
    # and not `blind`: beating an arm blind by construction tests nothing (rule blind_comparators)
    assert "`blind: {path_only: why it fails by construction}`" not in out
    # a control on a train metric shows memorisation, not that the arm works: refused
    data["controls"].append(
        {
            "kind": "threshold",
            "arm": "path_only",
            "metric": "train_acc",
            "direction": "higher",
            "value": 0.2,
            "control": "positive",
        }
    )
    loaded = load_contract(write_contract(tmp_path, data))
    assert any("controls.2.metric" in f and "train metric" in f for f in rule_flags(loaded))
    # on held-out trees of its training depths (val_acc, beyond chance ~0.1): the contract follows every rule
    data["controls"][-1]["metric"] = "val_acc"
    loaded = load_contract(write_contract(tmp_path, data))
    assert rule_flags(loaded) == []
    require_current_rules(loaded, tmp_path / "runs")
    # a baseline declared blind, failing by construction, is no comparator: beating it tests nothing
    blind = {
        **data,
        "controls": data["controls"][:-1],
        "blind": {**data["blind"], "path_only": "no node values"},
    }
    flags = rule_flags(load_contract(write_contract(tmp_path, blind)))
    assert len(flags) == 1 and flags[0].startswith("decision.supported_if.0.other: asserts that ")
    assert "(rule: no claim to beat an arm blind by construction)" in flags[0]
    # recorded contracts that predate the rule keep loading, flagged
    assert any(
        "positive control" in f
        for f in rule_flags(load_contract(C05.parent / "treeheap-vs-dense.yaml"))
    )


def test_control_references_are_checked(tmp_path):
    data = yaml.safe_load(C05.read_text())
    data["controls"] = [
        {
            "kind": "threshold",
            "arm": "nope",
            "metric": "test_acc",
            "direction": "higher",
            "value": 0.2,
            "control": "positive",
        }
    ]
    with pytest.raises(UserError, match=r"controls\.0\.arm: no arm named 'nope'"):
        load_contract(write_contract(tmp_path, data))
    data["controls"][0].update(arm="flat_address", control="maybe")
    with pytest.raises(UserError, match="control"):
        load_contract(write_contract(tmp_path, data))


def test_decisions_alone_are_unchanged():
    d = Decision.model_validate(
        {"supported_if": [WINS], "refuted_if": [thr("tree", "nll", "higher", 9.0)]}
    )
    v = decide(d, experiment([3.91, 3.88, 3.95, 3.90, 3.86], [5.01, 4.97, 5.05, 4.99, 5.02]))
    assert v.controls == [] and v.verdict == "supported"


def test_the_committed_invalid_example_shows_everywhere(tmp_path):
    """c05-baseline-control is recorded invalid (its flat-address baseline cannot locate the pattern even
    at its training depths): under today's engine its evidence, verdict.md, status and the dashboard say
    so. On a copy of the frozen claim (tests/fixtures/claims), never the repository's runs/."""
    import json
    import subprocess
    import sys

    from gates.dashboard.site import Site
    from tests.conftest import copy_claims, frozen_evidence

    recorded = frozen_evidence("c05-baseline-control")  # the per-seed values, as recorded
    values = {(r["arm"], r["seed"]): r["metrics"] for r in recorded["runs"]}
    flat = [m["val_acc"] for (arm, _), m in values.items() if arm == "flat_address"]
    assert len(flat) == 8 and all(
        0.17 <= v <= 0.31 for v in flat
    )  # far below the control's bar 0.9
    assert all(
        values[("subheap_kernel", seed)]["test_acc"] == 1.0
        and m["test_acc"] <= 0.02  # the comparison alone
        for (arm, seed), m in values.items()
        if arm == "flat_address"
    )  # is won on every seed

    project = copy_claims(tmp_path, "c05-baseline-control")
    folder = project / "runs" / "c05-baseline-control"
    ev = json.loads((folder / "evidence.json").read_text())
    assert ev["verdict"] == "invalid" and ev["controls"][0]["outcome"] == "fails"
    assert ev["controls"][0]["values"]["flat_address.val_acc"] == flat
    assert "**INVALID**" in (folder / "verdict.md").read_text()
    status = subprocess.run(
        [sys.executable, "-m", "gates", "status", "--json"],
        capture_output=True,
        text=True,
        cwd=project,
        timeout=120,
    )
    row = next(c for c in json.loads(status.stdout) if c["id"] == "c05-baseline-control")
    assert (row["verdict"], row["status"]) == ("invalid", "ok")
    site = Site(
        project / "runs",
        project / "contracts",
        f"sqlite:///{tmp_path / 'none.db'}",
        "http://127.0.0.1:5000",
    )
    assert "v-invalid" in site.index()
