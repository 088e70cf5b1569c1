"""Design rules (issues #24 part 3 and #25): each loophole an audit found, and each design a reviewer
would not pass, is refused by `gates check` with one line naming the file, line, field and rule; the
guards that act on the verdict (tuning stopped at an edge, a bar beyond its measured ceiling) change it;
the cross-claim flags (a regime left by a superseded sibling, runs shared across contracts) show in
`gates status`. Each starts from the committed C05 contract brought to today's rules (`c05_current`,
which `gates check` accepts: tests/test_verdict_integrity.py) and changes one thing."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from typer.testing import CliRunner

from gates.cli import app, check
from gates.contract import Decision, load_contract
from gates.design import rule_flags
from gates.design._rules import RULES
from gates.errors import UserError
from gates.inference import decide
from gates.inference._effects import _describe as describe
from gates.record import render_report
from gates.study import get_study, proportion
from tests.conftest import c05_current, copy_claims, write_contract
from tests.test_verdict import runs

TUNING = {
    "space": {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}},
    "trials": 2,
    "objective": {"metric": "val_loss", "direction": "lower"},
    "seeds": [100],
    "sampler": {"kind": "random", "seed": 7},
}


def refused(tmp_path, mutate) -> list[str]:
    """`gates check`'s error lines for c05_current changed by `mutate` (each: FILE:LINE: field: message)."""
    data = c05_current()
    data["id"] = "c05-design"
    mutate(data)
    path = write_contract(tmp_path, data)
    with pytest.raises(UserError) as info:
        check(path, runs_dir=tmp_path / "runs", contracts_dir=path.parent, as_json=False)
    lines = info.value.render().splitlines()
    assert all(line.startswith(f"{path}:") for line in lines), lines
    return lines


def one(lines: list[str], *words: str) -> str:
    """The single line that has every word (a rule's refusal is one line)."""
    found = [line for line in lines if all(w in line for w in words)]
    assert len(found) == 1, (words, lines)
    return found[0]


def control(**kw) -> dict:
    return {
        "kind": "threshold",
        "arm": "flat_address",
        "metric": "test_acc",
        "direction": "higher",
        "value": 0.5,
        "control": "positive",
        **kw,
    }


# ---------------------------------------------------------------------------------- issue #24 part 3
def test_a_positive_control_that_a_broken_arm_passes_is_refused(tmp_path):
    lines = refused(
        tmp_path, lambda d: d["controls"].append(control(direction="lower", value=0.99))
    )
    line = one(lines, "controls.2.direction")
    assert (
        "must assert that flat_address works" in line
        and "(rule: a positive control asserts its arm works)" in line
    )


def test_a_control_bar_outside_its_metric_range_is_refused(tmp_path):
    lines = refused(tmp_path, lambda d: d["controls"].append(control(value=2.0)))
    assert "cannot hold for any value" in one(lines, "controls.2.value")


def test_a_control_on_a_training_metric_is_refused(tmp_path):
    lines = refused(tmp_path, lambda d: d["controls"].append(control(metric="train_acc")))
    line = one(lines, "controls.2.metric")
    assert "a control reads 'train_acc', a train metric" in line and "validation" in line


def test_a_handicapped_comparator_is_refused(tmp_path):
    """Arms the decision compares differ only in the declared factor (here `features`)."""
    lines = refused(tmp_path, lambda d: d["arms"]["flat_address"].update(lr=1e-6))
    line = one(lines, "differences", "'lr'")
    assert (
        "flat_address 1e-06" in line
        and "(rule: compared arms differ only in the declared factor)" in line
    )

    def declared(d):
        d["arms"]["flat_address"]["lr"] = 1e-6
        d["differences"] = {"lr": "the flat kernel's embedding table diverges at the default lr"}

    data = c05_current()
    declared(data)
    assert rule_flags(load_contract(write_contract(tmp_path, data, "declared.yaml"))) == []


def test_two_arms_with_one_config_are_refused(tmp_path):
    lines = refused(
        tmp_path, lambda d: d["arms"].update(path_only=copy.deepcopy(d["arms"]["flat_address"]))
    )
    assert "has the same config as arm 'flat_address'" in one(lines, "arms.path_only")


def test_an_easy_bar_and_an_unrefutable_refutation_are_refused(tmp_path):
    """A mean rank is at most the test trees' node count (127 at depths 5-6): `<= 1000` holds for every arm,
    `>= 1e6` never; and an arm at chance (rank 48: 32 or 64 on the two test depths) clears `<= 100`."""

    def loose(d):
        d["decision"]["supported_if"][0] = {
            "kind": "threshold",
            "arm": "subheap_kernel",
            "metric": "mean_rank",
            "direction": "lower",
            "value": 1000,
        }
        d["decision"]["refuted_if"][0] = {
            "kind": "threshold",
            "arm": "subheap_kernel",
            "metric": "mean_rank",
            "direction": "higher",
            "value": 1e6,
        }

    lines = refused(tmp_path, loose)
    assert "holds for every value" in one(
        lines, "supported_if.0.value"
    ) and "subheap_kernel: [1, 127]" in one(lines, "supported_if.0.value")
    assert "cannot hold for any value" in one(lines, "refuted_if.0.value")

    def at_chance(d):
        d["decision"]["supported_if"][0] = {
            "kind": "threshold",
            "arm": "subheap_kernel",
            "metric": "mean_rank",
            "direction": "lower",
            "value": 100,
        }

    line = one(refused(tmp_path, at_chance), "supported_if.0.value")
    assert (
        "an arm that learned nothing (mean_rank at chance, 48) already satisfies mean_rank <= 100"
        in line
    )


def test_a_condition_against_the_predicted_direction_is_refused(tmp_path):
    lines = refused(
        tmp_path,
        lambda d: d["decision"]["supported_if"].append(
            {
                "kind": "compare",
                "arm": "subheap_kernel",
                "metric": "test_acc",
                "other": "flat_address",
                "direction": "lower",
                "margin": 0.1,
            }
        ),
    )
    line = one(lines, "supported_if.4.direction")
    assert "the contract's predicted ablation (gate 3) says higher" in line


def test_hand_picked_seeds_are_refused_and_a_count_is_not(tmp_path):
    line = one(refused(tmp_path, lambda d: d.update(seeds=[0, 3, 4, 6, 8, 9])), "seeds")
    assert "not contiguous" in line and "(rule: seeds are a count)" in line
    data = c05_current()
    data["seeds"] = {"count": 6, "start": 10}
    assert load_contract(write_contract(tmp_path, data, "start.yaml")).contract.seeds == [
        10,
        11,
        12,
        13,
        14,
        15,
    ]


def test_a_condition_on_a_metric_the_arm_does_not_report_is_refused(tmp_path, monkeypatch):
    """A refutation on a metric the study never reports for that arm could never be measured."""
    study = type(get_study("c05_probe"))
    monkeypatch.setattr(
        study,
        "reported_metrics",
        lambda self, config: (
            frozenset(self.metrics) - ({"hit_at_3"} if config.features == "flat_address" else set())
        ),
    )
    lines = refused(
        tmp_path,
        lambda d: d["decision"]["refuted_if"].append(
            {
                "kind": "threshold",
                "arm": "flat_address",
                "metric": "hit_at_3",
                "direction": "higher",
                "value": 0.5,
                "refutes": "that flat_address is blind (rule `refutation`)",
            }
        ),
    )
    assert "does not report for that arm's config" in one(lines, "refuted_if.4", "hit_at_3")


def test_tuning_may_search_only_the_studys_hyperparameters(tmp_path):
    def tuned(d):
        d["tuning"] = copy.deepcopy(TUNING)
        d["tuning"]["space"]["hidden"] = {"type": "int", "low": 8, "high": 64}

    line = one(refused(tmp_path, tuned), "tuning.space.hidden")
    assert "not a hyperparameter of study 'c05_probe' (declared: lr, weight_decay)" in line


def test_two_metrics_on_different_units_are_not_compared(tmp_path):
    lines = refused(
        tmp_path,
        lambda d: d["decision"]["supported_if"].append(
            {
                "kind": "compare",
                "arm": "subheap_kernel",
                "metric": "test_acc",
                "other": "flat_address",
                "other_metric": "hit_at_3",
                "direction": "higher",
                "margin": 0.5,
            }
        ),
    )
    assert "does not declare on one unit" in one(lines, "supported_if.4:")


def test_a_look_without_its_seeds_lists_them_as_lost():
    """A direct judge of a sequential look whose seeds have no runs: the engine names them lost itself."""
    d = Decision.model_validate(
        {
            "supported_if": [
                {
                    "kind": "threshold",
                    "arm": "a",
                    "metric": "acc",
                    "direction": "higher",
                    "value": 0.5,
                }
            ],
            "refuted_if": [
                {
                    "kind": "threshold",
                    "arm": "a",
                    "metric": "acc",
                    "direction": "lower",
                    "value": 0.5,
                }
            ],
        }
    )
    v = decide(
        d,
        runs("a", acc=[0.9, 0.91, 0.93, 0.92]),
        {"acc": proportion("higher", "test")},
        seeds=list(range(10)),
    )
    assert v.verdict != "supported"
    assert [x.seed for x in v.lost] == [4, 5, 6, 7, 8, 9] and {x.why for x in v.lost} == {
        "no run recorded"
    }


# ---------------------------------------------------------------------------------- issue #25
def test_a_negative_result_needs_a_working_arm_or_a_blind_declaration(tmp_path):
    """Without `blind`, each condition asserting flat_address or path_only fails is refused, naming the arm."""
    lines = refused(tmp_path, lambda d: d.pop("blind"))
    for index, arm in ((2, "flat_address"), (3, "path_only")):
        line = one(lines, f"supported_if.{index}:")
        assert (
            f"asserts that arm {arm!r} fails" in line
            and f"`blind: {{{arm}: why it fails by construction}}`" in line
        )
    # and the refutations that assert the subheap arms fail need their positive controls
    lines = refused(tmp_path, lambda d: d.pop("controls"))
    assert "asserts that arm 'subheap_kernel' fails" in one(lines, "refuted_if.0:")


def test_a_bar_beyond_a_ceiling_known_before_the_run_is_refused(tmp_path):
    def capped(d):  # an accuracy bar
        d["decision"]["supported_if"][0].update(metric="test_acc", direction="higher", value=0.95)
        d["decision"]["supported_if"][0]["ceiling"] = {
            "value": 0.9,
            "why": "10% of the test trees are ambiguous",
        }

    line = one(refused(tmp_path, capped), "supported_if.0.value")
    assert (
        "the bar 0.95 is not below what the best possible arm reaches (0.9: 10% of the test trees"
        in line
    )


def test_a_training_study_needs_a_convergence_rule_or_a_reason(tmp_path):
    line = one(refused(tmp_path, lambda d: d.pop("convergence")), "convergence:")
    assert "(rule: a training study's contract judges convergence)" in line
    data = c05_current()
    data.pop("convergence")
    data["no_convergence"] = "a probe trained full-batch to zero training loss"
    assert rule_flags(load_contract(write_contract(tmp_path, data, "waived.yaml"))) == []


def test_tuning_stopped_at_an_edge_leaves_its_arms_undetermined(tmp_path):
    """The best of the values tried is the lowest: the optimum may lie below, so a decision condition reading
    that arm is undetermined, the verdict says where to widen, and a declared hard limit lifts it."""
    from gates.inference import tuning_edges as edges

    data = c05_current()
    data["tuning"] = copy.deepcopy(TUNING)
    loaded = load_contract(write_contract(tmp_path, data))
    trial = lambda n, lr, v: {"number": n, "params": {"lr": lr}, "state": "completed", "value": v}  # noqa: E731
    record = {
        "arms": {
            arm: {
                "trials": [trial(0, 0.003, 0.1), trial(1, 0.03, 0.4)],
                "best": {"number": 0, "params": {"lr": 0.003}, "value": 0.1},
            }
            for arm in data["arms"]
        }
    }
    found = edges(loaded.contract, record)
    assert (
        found["subheap_kernel"]
        == "lr = 0.003 is the lowest of the 2 values tried; widen the search below 0.003"
    )
    good, bad = [0.1, 0.12, 0.11, 0.105, 0.115], [3.0, 3.1, 2.9, 3.05, 2.95]  # test losses
    measured = [
        r for arm in ("subheap_kernel", "path_subheap_kernel") for r in runs(arm, test_loss=good)
    ]
    measured += [r for arm in ("flat_address", "path_only") for r in runs(arm, test_loss=bad)]
    v = decide(loaded.contract.decision, measured, loaded.study.metrics, edges=found)
    assert (
        decide(loaded.contract.decision, measured, loaded.study.metrics).verdict == "supported"
    )  # without the edges
    assert v.verdict == "inconclusive"
    first = v.conditions[0]
    assert (
        first.outcome == "undetermined" and "tuning stopped at the edge of its search" in first.note
    )
    assert "widen the search below 0.003" in v.settle[0] and v.tuning_edges == found
    data["tuning"]["space"]["lr"]["hard"] = ["low"]
    hard = load_contract(write_contract(tmp_path, data, "hard.yaml"))
    assert edges(hard.contract, record) == {}


def test_a_tuning_edge_is_flagged_in_verdict_md():
    ev = json.loads(json.dumps(_minimal_evidence()))
    ev["tuning_edges"] = {
        "lifting": "lr = 0.003432 is the lowest of the 2 values tried; widen the search below 0.003432"
    }
    assert "- lifting: lr = 0.003432 is the lowest of the 2 values tried" in render_report(ev)


def _minimal_evidence() -> dict:
    return {
        "contract_id": "x",
        "contract_sha256": "0" * 64,
        "verdict": "inconclusive",
        "git_commit": "0" * 40,
        "git_dirty": "false",
        "code_sha256": "0" * 64,
        "created_at": "2026-12-01T00:00:00+00:00",
        "settings": {
            "alpha": 0.05,
            "evaluation": "interval",
            "correction": "iut+holm",
            "seeds": [0, 1],
            "budget": {"steps": 1, "eval_every": 1},
            "arm_configs": {},
        },
        "runs": [],
        "conditions": [],
    }


def test_status_names_shared_runs_and_a_regime_left(tmp_path):
    """Recorded claims that ran the same arm, seed and settings share one observation; a claim standing in
    the regime a superseded sibling left is flagged (here: c05-structural-probe-hard's harder pattern
    supersedes its sibling c05-structural-probe, so c05-baseline-control stands in the old regime)."""
    root = copy_claims(
        tmp_path,
        "c05-structural-probe",
        "c05-structural-probe-v2",
        "c05-baseline-control",
        "c05-structural-probe-hard",
    )
    runner = CliRunner()
    rows = {
        r["id"]: r
        for r in json.loads(
            runner.invoke(
                app,
                [
                    "status",
                    "--json",
                    "--runs-dir",
                    str(root / "runs"),
                    "--contracts-dir",
                    str(root / "contracts"),
                ],
            ).stdout
        )
    }
    shared = rows["c05-baseline-control"]["shared_runs"]
    assert (
        "c05-structural-probe-v2" in shared
        and "flat_address/seed 0" in shared["c05-structural-probe-v2"]
    )
    assert rows["c05-structural-probe-v2"]["shared_runs"]["c05-baseline-control"]

    hard = root / "contracts" / "c05-structural-probe-hard.yaml"
    data = yaml.safe_load(hard.read_text())
    assert "supersedes" not in data
    # a new version of the hard contract would declare it; here its recorded evidence says so (as evidence
    # whose contract is gone still does), so that no recorded contract is edited
    ev_path = root / "runs" / "c05-structural-probe-hard" / "evidence.json"
    ev = json.loads(ev_path.read_text())
    ev["supersedes"] = "c05-structural-probe"
    from gates.record import record_entry, write_evidence

    write_evidence(root / "runs", ev)
    record_entry(root / "runs", ev_path, "rederived", "test: declares what it supersedes")
    rows = {
        r["id"]: r
        for r in json.loads(
            runner.invoke(
                app,
                [
                    "status",
                    "--json",
                    "--runs-dir",
                    str(root / "runs"),
                    "--contracts-dir",
                    str(root / "contracts"),
                ],
            ).stdout
        )
    }
    left = rows["c05-baseline-control"]["regime_left"]
    assert (
        left["sibling"] == "c05-structural-probe"
        and left["superseded_by"] == "c05-structural-probe-hard"
    )
    assert any(change.startswith("pattern ") for change in left["changes"])
    assert rows["c05-structural-probe-v2"]["regime_left"] is not None  # same regime, still standing
    assert rows["c05-structural-probe-hard"]["regime_left"] is None


# ---------------------------------------------------------------------------------- issue #38 part 4
def flags_of(tmp_path, mutate, rule: str) -> list[str]:
    """The flags of rule `rule` (its short name) on c05_current changed by `mutate`."""
    data = c05_current()
    mutate(data)
    loaded = load_contract(write_contract(tmp_path, data, "accepted.yaml"))
    return [f for f in rule_flags(loaded) if f.endswith(f"(rule: {RULES[rule]})")]


def test_a_bar_looser_than_the_falsifiable_point_is_refused(tmp_path):
    """Gate 5 says where the claim first fails; a supported_if bar on its (arm, metric) that is looser, or
    in the other direction, lets a result the claim's own words refute support it."""

    def point(**kw):  # c05_current's supported_if[0] is subheap_kernel.test_loss <= 0.5
        return lambda d: d["preflight"]["falsifiable_point"].update(
            {"metric": "test_loss", "direction": "lower", **kw}
        )

    line = one(refused(tmp_path, point(threshold=0.4)), "supported_if.0.value")
    assert (
        "the bar 0.5 is looser than the falsifiable point (gate 5: subheap_kernel.test_loss <= 0.4)"
        in line
        and f"(rule: {RULES['falsifiable_point']})" in line
    )
    line = one(
        refused(tmp_path, point(threshold=0.5, direction="higher")), "supported_if.0.direction"
    )
    assert "contradicts the claim's own words; expected direction 'higher'" in line
    assert flags_of(tmp_path, point(threshold=0.5), "falsifiable_point") == []
    assert flags_of(tmp_path, point(threshold=0.6), "falsifiable_point") == []  # stricter bar


def test_a_negative_control_lies_between_chance_and_the_positive_bar(tmp_path):
    """flat_address's val_loss: chance about 2.33 nats (lower is better); the positive controls ask the
    subheap arms for <= 0.5. A negative control `val_loss >= 0.4` is passed by a working arm too; one at
    `>= 3` is failed even by an arm at chance."""

    def negative(value):
        return lambda d: d["controls"].append(
            control(metric="val_loss", direction="higher", value=value, control="negative")
        )

    line = one(refused(tmp_path, negative(0.4)), "controls.2.value")
    assert "a working arm passes it too (a positive control asks <= 0.5)" in line
    assert (
        "expected a bar between the arm's chance level (2.327) and the positive control's bar (0.5)"
        in line
    )
    line = one(refused(tmp_path, negative(3.0)), "controls.2.value")
    assert "even an arm at chance (2.327) fails it" in line
    assert f"(rule: {RULES['negative_controls']})" in line
    assert flags_of(tmp_path, negative(1.0), "negative_controls") == []


def test_a_wide_non_inferiority_margin_is_refused(tmp_path):
    """test_acc ranges over [0, 1]: 'no worse by more than 0.2' lets almost any result pass. A margin is
    also at most the smallest effect of interest the decision declares for its metric (issue #38), and
    that at most the predicted effect on it (gate 3 predicts 0.7 on test_acc)."""

    def no_worse(margin, smallest=None):
        def mutate(d):
            d["seeds"] = 10  # enough for the sign test of a median (rule `reachable`)
            d["decision"]["supported_if"].append(
                {
                    "kind": "compare",
                    "arm": "subheap_kernel",
                    "metric": "test_acc",
                    "other": "path_subheap_kernel",
                    "direction": "higher",
                    "margin": margin,
                    "test": "paired",
                }
            )
            if smallest is not None:
                d["decision"]["smallest_effects"] = {"test_acc": smallest}

        return mutate

    line = one(refused(tmp_path, no_worse(-0.2, 0.2)), "supported_if.4.margin")
    assert "the non-inferiority margin 0.2 is 20% of the range of test_acc" in line
    assert "expected a margin of at most 10% of the range (0.1)" in line
    assert f"(rule: {RULES['non_inferiority']})" in line
    assert flags_of(tmp_path, no_worse(-0.05, 0.05), "non_inferiority") == []
    line = one(refused(tmp_path, no_worse(-0.05)), "supported_if.4.margin")
    assert "the non-inferiority margin 0.05 on test_acc has no declared smallest effect" in line
    assert "expected `decision.smallest_effects: {test_acc: S}`" in line
    line = one(refused(tmp_path, no_worse(-0.05, 0.03)), "supported_if.4.margin")
    assert "exceeds the declared smallest effect of interest 0.03" in line
    line = one(refused(tmp_path, no_worse(-0.05, 0.8)), "smallest_effects.test_acc")
    assert "exceeds the predicted effect 0.7 on test_acc (gate 3)" in line


def test_a_relative_non_inferiority_margin_on_a_log_scale_metric(tmp_path):
    """On a log-scale metric (judged by ratios) non-inferiority is a negative relative margin ("no more
    than 2% above": lower, relative_margin -0.02), bounded by the smallest effect of interest declared
    as a share; on a linear metric, whose smallest effect is absolute, it is refused."""

    def no_worse(metric, relative, smallest=None):
        def mutate(d):
            d["decision"]["supported_if"].append(
                {
                    "kind": "compare",
                    "arm": "subheap_kernel",
                    "metric": metric,
                    "other": "path_subheap_kernel",
                    "direction": "lower" if metric == "test_loss" else "higher",
                    "relative_margin": relative,
                }
            )
            if smallest is not None:
                d["decision"]["smallest_effects"] = {metric: smallest}

        return mutate

    assert flags_of(tmp_path, no_worse("test_loss", -0.02, 0.02), "non_inferiority") == []
    line = one(refused(tmp_path, no_worse("test_loss", -0.02)), "supported_if.4.relative_margin")
    assert "the non-inferiority margin 0.02 (a share) on test_loss has no declared smallest" in line
    line = one(
        refused(tmp_path, no_worse("test_loss", -0.05, 0.02)), "supported_if.4.relative_margin"
    )
    assert "exceeds the declared smallest effect of interest 0.02" in line
    line = one(
        refused(tmp_path, no_worse("test_acc", -0.02, 0.02)), "supported_if.4.relative_margin"
    )
    assert (
        "a relative non-inferiority margin on 'test_acc', which study 'c05_probe' does not" in line
    )
    # read as a bound on the other side of the comparator, and described so
    loaded = load_contract(
        write_contract(tmp_path, _mutated(no_worse("test_loss", -0.02, 0.02)), "described.yaml")
    )
    condition = loaded.contract.decision.supported_if[-1]
    assert condition.non_inferiority
    assert describe(condition) == (
        "subheap_kernel.test_loss <= path_subheap_kernel.test_loss * (1 + 0.02)"
    )


def _mutated(mutate) -> dict:
    data = c05_current()
    mutate(data)
    return data


def test_a_claim_to_beat_a_cheaper_arm_needs_matched_cost(tmp_path):
    """Gate 1 bounds each arm against a baseline of the author's choosing: c05's flat_address (4,097
    parameters, 64 FLOPs) leaves path_subheap_kernel (641, 1,216) within its declared 20x while it costs
    2.5x subheap_kernel's parameters. A claim that it beats subheap_kernel is about compute as much as
    design (issue #38); the other way round, the cheaper arm beating the dearer one, is not."""

    def beats(arm, other):
        return lambda d: d["decision"]["supported_if"].append(
            {
                "kind": "compare",
                "arm": arm,
                "metric": "test_loss",
                "other": other,
                "direction": "lower",
                "relative_margin": 0.1,
                "test": "paired",
            }
        )

    lines = refused(tmp_path, beats("path_subheap_kernel", "subheap_kernel"))
    line = one(lines, "supported_if.4:", "x its parameters")
    assert (
        "asserts that 'path_subheap_kernel' beats 'subheap_kernel' at 2.49x its parameters" in line
    )
    assert "within 2x (the smaller of 2 and gate 1's max_ratio)" in line
    assert f"(rule: {RULES['compute']})" in line
    assert "at 2.71x its FLOPs" in one(lines, "supported_if.4:", "x its FLOPs")
    assert flags_of(tmp_path, beats("subheap_kernel", "path_subheap_kernel"), "compute") == []

    def tight_gate(d):  # the declared bound binds the pair too when it is the smaller
        beats("path_only", "subheap_kernel")(d)  # 1.75x parameters, 1.86x FLOPs
        d["preflight"]["compute_cost"]["max_ratio"] = 1.5

    assert len(flags_of(tmp_path, tight_gate, "compute")) == 2


def test_beating_a_blind_arm_is_refused(tmp_path):
    """flat_address is declared blind (it cannot see a node value): a claim that the subheap kernel beats
    it is true by construction, written either way round. It may still be asserted to fail."""

    def beats(arm, other, direction):
        return lambda d: d["decision"]["supported_if"].append(
            {
                "kind": "compare",
                "arm": arm,
                "metric": "test_loss",
                "other": other,
                "direction": direction,
                "relative_margin": 0.5,
                "test": "paired",
            }
        )

    line = one(
        refused(tmp_path, beats("subheap_kernel", "flat_address", "lower")),
        "supported_if.4.other",
    )
    assert (
        "asserts that subheap_kernel beats arm 'flat_address', which the contract declares blind"
        in line
    )
    assert f"(rule: {RULES['blind_comparators']})" in line
    line = one(
        refused(tmp_path, beats("flat_address", "subheap_kernel", "higher")), "supported_if.4.arm"
    )
    assert "asserts that subheap_kernel beats arm 'flat_address'" in line
    # against an arm with a positive control; c05_current's thresholds assert the blind arms fail
    assert (
        flags_of(
            tmp_path, beats("subheap_kernel", "path_subheap_kernel", "lower"), "blind_comparators"
        )
        == []
    )
    assert flags_of(tmp_path, lambda d: None, "blind_comparators") == []

    def unblinded(
        d,
    ):  # without `blind`, the way out negative_results names is a positive control only
        beats("subheap_kernel", "flat_address", "lower")(d)
        d["blind"].pop("flat_address")

    line = one(refused(tmp_path, unblinded), "supported_if.4:", "compares with baseline arm")
    assert "expected a positive control on 'flat_address'" in line and "`blind:" not in line


def test_a_refutation_of_nothing_the_claim_asserts_says_what_it_refutes(tmp_path):
    """c05_current's supported_if conditions read the arms' test_loss: a refutation on subheap_kernel's
    test_acc mirrors none of them, and says what it refutes or is refused."""

    def refutation(**kw):
        def mutate(d):
            d["seeds"] = 10  # enough for the sign test in the Holm family (rule `reachable`)
            d["decision"]["refuted_if"].append(
                {
                    "kind": "threshold",
                    "arm": "subheap_kernel",
                    "metric": "test_acc",
                    "direction": "lower",
                    "value": 0.5,
                    **kw,
                }
            )

        return mutate

    line = one(refused(tmp_path, refutation()), "refuted_if.4:")
    assert "reads subheap_kernel.test_acc, which no supported_if condition reads" in line
    assert "`refutes: what it refutes`" in line and f"(rule: {RULES['refutation']})" in line
    why = "the premise that the subheap kernel locates the pattern at all (most trees right)"
    assert flags_of(tmp_path, refutation(refutes=why), "refutation") == []

    def on_support(d):
        d["decision"]["supported_if"][0]["refutes"] = why

    assert "expected it only on a refuted_if condition" in one(
        refused(tmp_path, on_support), "supported_if.0.refutes"
    )
