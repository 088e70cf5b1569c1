"""What every study of this repository declares beyond its metrics (gates.study, issues #24/#25): scales and
units, ranges per arm (`metric_range`), chance (`chance`), ceilings (`ceiling`), the metrics an arm reports
(`reported_metrics`), `hyperparameters`, `regime_fields` and `trains`, checked for consistency on every arm
of every committed contract; then a few values worked out by hand, and, on tiny runs, that run() returns
exactly the metrics `reported_metrics` promises (and the ceiling metric the relation-closure study adds)."""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from gates.study import Budget, Ceiling, Metric, NullReporter, Study, get_study, study_entries
from tests.conftest import tiny_teacher
from tests.helpers import translator_rows

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = sorted((ROOT / "contracts").glob("*.yaml"))
EXAMPLE = ROOT / "examples" / "my_study"
# this repository's studies (a plugin a test registers, e.g. examples/my_study, has its own module)
OWN = [e.name for e in study_entries() if e.module.startswith("gates.models.")]
# fields that say what an arm is (the model, kernel, parent, topology, read, encoder rule): what contracts
# compare, never something a tuning search may pick
IDENTITY = {
    "arm",
    "features",
    "parent",
    "topology",
    "read",
    "merge",
    "fold",
    "unit",
    "accounting",
    "leaf_set",
}


@functools.lru_cache(maxsize=1)
def example_module():
    """examples/my_study's study module, loaded from its file under a name of its own (it is not installed
    here, and a test that installs it must not find this copy)."""
    spec = importlib.util.spec_from_file_location(
        "_my_study_example", EXAMPLE / "my_study" / "study.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the config's annotations through it
    spec.loader.exec_module(module)
    return module


def example_study() -> Study:
    return example_module().MyStudy()


def studies() -> dict[str, Study]:
    return {**{name: get_study(name) for name in OWN}, "my_study": example_study()}


def contracts_of(name: str) -> list[dict]:
    paths = CONTRACTS if name != "my_study" else sorted((EXAMPLE / "contracts").glob("*.yaml"))
    found = [yaml.safe_load(p.read_text()) | {"_path": p.name} for p in paths]
    return [c for c in found if c["study"] == name]


def named_metrics(contract: dict) -> dict[str, set[str]]:
    """arm -> the metrics the contract reads from it: conditions, controls, gates 3 and 5, futility and
    convergence rules, the tuning objective (divergence rules only watch what is reported)."""
    arms = list(contract["arms"])
    named: dict[str, set[str]] = {arm: set() for arm in arms}

    def condition(c: dict) -> None:
        if c.get("arm") is not None and c.get("metric") is not None:
            named[c["arm"]].add(c["metric"])
        if c.get("arm") is not None and c.get("metrics"):
            named[c["arm"]].update(c["metrics"])
        if c.get("arms") and c.get("metric"):
            for arm in c["arms"]:
                named[arm].add(c["metric"])
        if c.get("other") is not None:
            named[c["other"]].add(c.get("other_metric") or c["metric"])
        if c.get("versus") is not None:
            named[c["versus"]].add(c["metric"])

    decision = contract["decision"]
    for c in [
        *decision.get("supported_if", []),
        *decision.get("refuted_if", []),
        *(contract.get("controls") or []),
    ]:
        condition(c)
    preflight = contract.get("preflight") or {}
    for key in ("falsifiable_point", "predicted_ablation"):
        if isinstance(preflight.get(key), dict):
            condition(preflight[key])
    for rule in (contract.get("stop_rules") or {}).get("futility") or []:
        for arm in rule.get("arms") or arms:
            named[arm].add(rule["metric"])
    if contract.get("convergence"):
        for arm in arms:
            named[arm].add(contract["convergence"]["metric"])
    tuning = contract.get("tuning")
    if tuning:
        trials = tuning.get("trials")
        for arm in trials if isinstance(trials, dict) else arms:
            named[arm].add(tuning["objective"]["metric"])
    return named


def inside(value: float, low: float | None, high: float | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


# ------------------------------------------------------------------------------------ consistency
def test_the_repository_studies_are_all_here():
    assert {
        "c05_probe",
        "relation_closure",
        "bif_lm",
        "spr_hash",
        "twin_tree",
        "treeheap_translator",
        "butterfly_reach",
        "biic_lm",
        "biic_algebra",
    } <= set(OWN)


@pytest.mark.parametrize("name", [*OWN, "my_study"])
def test_class_declarations_are_config_fields_and_consistent(name):
    study = studies()[name]
    fields = set(study.Config.model_fields)
    assert isinstance(study.hyperparameters, frozenset) and study.hyperparameters <= fields, name
    assert not study.hyperparameters & IDENTITY, (
        f"{name}: a tuning search may not pick what an arm is"
    )
    assert isinstance(study.regime_fields, tuple) and set(study.regime_fields) <= fields, name
    assert len(set(study.regime_fields)) == len(study.regime_fields)
    assert not study.hyperparameters & set(study.regime_fields), (
        f"{name}: a regime field is not tuned"
    )
    assert isinstance(study.trains, bool)
    if study.trains:
        assert study.hyperparameters, f"{name} trains: something (its learning rate) may be tuned"
    scales: dict[str, set[str]] = {}
    for metric, spec in study.metrics.items():
        assert isinstance(spec, Metric)
        if spec.scale == "log":
            assert spec.low is not None and spec.low >= 0, metric
        if spec.unit is not None:
            scales.setdefault(spec.unit, set()).add(spec.scale)
    # metrics that may be compared with each other (one unit) are estimated alike (one scale)
    assert all(len(found) == 1 for found in scales.values()), (name, scales)


@pytest.mark.parametrize("name", [*OWN, "my_study"])
def test_every_committed_arm_reports_what_its_contracts_name_and_declares_within_its_ranges(name):
    study = studies()[name]
    contracts = contracts_of(name)
    if not contracts:
        pytest.skip(f"no committed contract of {name}")
    for contract in contracts:
        where = contract["_path"]
        for field in (contract.get("tuning") or {}).get("space", {}):
            assert field in study.hyperparameters, (
                f"{where}: tuning searches {field}, not a hyperparameter"
            )
        named = named_metrics(contract)
        for arm, raw in contract["arms"].items():
            config = study.Config.model_validate(raw)
            reported = study.reported_metrics(config)
            assert isinstance(reported, frozenset) and reported <= set(study.metrics), (where, arm)
            assert named[arm] <= reported, (
                f"{where}: {arm} does not report {sorted(named[arm] - reported)}"
            )
            for metric in study.metrics:
                spec = study.metrics[metric]
                low, high = study.metric_range(metric, config)
                assert (spec.low is None or (low is not None and low >= spec.low)) and (
                    spec.high is None or (high is not None and high <= spec.high)
                ), (where, arm, metric)
                assert low is None or high is None or low < high, (where, arm, metric)
                if spec.scale == "log":
                    assert low is not None and low >= 0, (where, arm, metric)
                chance = study.chance(metric, config)
                assert chance is None or (math.isfinite(chance) and inside(chance, low, high)), (
                    where,
                    arm,
                    metric,
                )
                ceiling = study.ceiling(metric, config)
                if ceiling is None:
                    continue
                assert isinstance(ceiling, Ceiling) and ceiling.why, (where, arm, metric)
                assert metric in reported, (
                    f"{where}: a ceiling for {metric}, which {arm} does not report"
                )
                if ceiling.value is not None:
                    assert inside(ceiling.value, low, high), (where, arm, metric)
                    if (
                        chance is not None
                    ):  # the best arm does at least as well as one that learned nothing
                        better = (
                            ceiling.value >= chance
                            if spec.direction == "higher"
                            else ceiling.value <= chance
                        )
                        assert better, (where, arm, metric)
                else:
                    assert ceiling.metric in reported and ceiling.metric != metric, (
                        where,
                        arm,
                        metric,
                    )
                    other = study.metrics[ceiling.metric]
                    assert other.direction == spec.direction, (where, arm, metric)


def test_metrics_compared_with_each_other_share_a_unit():
    """Every cross-metric comparison of a committed contract (other_metric, a trend over metrics) is between
    metrics of one unit."""
    for path in CONTRACTS:
        contract = yaml.safe_load(path.read_text())
        study = get_study(contract["study"])
        decision = contract["decision"]
        for c in [
            *decision.get("supported_if", []),
            *decision.get("refuted_if", []),
            *(contract.get("controls") or []),
        ]:
            metrics = c.get("metrics") or (
                [c["metric"], c["other_metric"]] if c.get("other_metric") else []
            )
            units = {study.metrics[m].unit for m in metrics}
            assert len(units) <= 1 and None not in units, (
                f"{path.name}: {metrics} have units {units}"
            )


# ------------------------------------------------------------------------------------ values by hand
def test_my_study_chance_is_the_majority_class_and_its_ceiling_the_label_noise():
    module = example_module()
    study = module.MyStudy()
    config = study.Config()
    chance = study.chance("test_acc", config)
    p_inside = math.pi * 0.5 / 4  # the disc x1^2 + x2^2 < 0.5 inside the square [-1, 1]^2
    assert chance == pytest.approx(
        1 - (p_inside * 0.95 + (1 - p_inside) * 0.05)
    ) and chance == pytest.approx(0.6, abs=0.01)
    ceiling = study.ceiling("test_acc", config)
    assert ceiling.value == pytest.approx(0.95) and "5%" in ceiling.why
    assert (
        study.ceiling("train_loss", config) is None and study.chance("train_loss", config) is None
    )
    assert study.hyperparameters == frozenset({"lr"})
    # what the example's data gives: the majority (outside) label's share of many noisy points
    _, labels = module.make_data(np.random.default_rng(0), 200_000, config.label_noise)
    assert 1 - labels.mean() == pytest.approx(chance, abs=0.004)
    assert study.ceiling("test_acc", study.Config(label_noise=0.2)).value == pytest.approx(0.8)


@pytest.mark.parametrize("test_depths", [[5], [5, 6], [4, 4, 7]])
def test_c05_mean_rank_is_at_most_the_node_count_and_chance_is_uniform_over_the_nodes(test_depths):
    from gates.models.c05_probe import C05ProbeConfig, make_datasets

    study = get_study("c05_probe")
    config = C05ProbeConfig(test_depths=test_depths, test_trees=4000)
    nodes = 2 ** (max(test_depths) + 1) - 1
    assert study.metric_range("mean_rank", config) == (1.0, float(nodes))
    _, test = make_datasets(config, seed=0)
    counts = test["exists"].sum(dim=1).double()  # the nodes a test tree's softmax is over
    assert counts.max() == nodes
    assert study.chance("test_acc", config) == pytest.approx(float((1 / counts).mean()), rel=0.03)
    assert study.chance("mean_rank", config) == pytest.approx(
        float(((counts + 1) / 2).mean()), rel=0.03
    )
    assert study.chance("test_loss", config) == pytest.approx(float(counts.log().mean()), rel=0.03)
    if test_depths == [5]:
        assert study.chance("test_acc", config) == pytest.approx(1 / 63)
        assert study.chance("hit_at_3", config) == pytest.approx(3 / 63)


def test_c05_chance_is_what_an_arm_that_learned_nothing_scores():
    """A kernel that scores every node alike (the zero function): loss log n, rank (ties broken by address)."""
    from gates.models.c05_probe import (
        C05ProbeConfig,
        StructuralKernel,
        make_datasets,
        masked_scores,
    )

    config = C05ProbeConfig(features="subheap_kernel", test_trees=2000)
    model = StructuralKernel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        _, test = make_datasets(config, seed=1)
        scores = masked_scores(model, test)
    loss = torch.nn.functional.cross_entropy(scores, test["target"]).item()
    assert loss == pytest.approx(get_study("c05_probe").chance("test_loss", config), rel=0.02)


def test_butterfly_and_language_model_chances():
    from gates.models.bif_lm import BifLMConfig
    from gates.models.biic_lm import BiicLMConfig
    from gates.models.butterfly_reach import ButterflyReachConfig
    from gates.models.treeheap_translator import TranslatorConfig

    butterfly = get_study("butterfly_reach")
    config = ButterflyReachConfig(values=8)
    for metric in (
        "test_acc",
        "short_test_acc",
        "accuracy_far",
        "short_accuracy_at_distance_3",
        "val_acc",
    ):
        assert butterfly.chance(metric, config) == 1 / 8
    assert butterfly.chance("val_loss", config) == pytest.approx(math.log(8))
    assert butterfly.chance("init_min_reach_share", config) is None
    assert get_study("bif_lm").chance("val_ppl", BifLMConfig(vocab_size=8000)) == 8000
    assert get_study("biic_lm").chance("test_loss", BiicLMConfig(vocab_size=2000)) == pytest.approx(
        math.log(2000)
    )
    assert get_study("biic_lm").chance("alpha_cos", BiicLMConfig(arm="sfe_v11")) is None
    translator = get_study("treeheap_translator")
    assert translator.chance("test_nll_zh2en", TranslatorConfig(arm="lifting")) == pytest.approx(
        math.log(4000)
    )
    twin = get_study("twin_tree")
    assert twin.chance("token_acc", twin.Config()) == pytest.approx(
        4 / 12
    )  # "you": 4 of the toy's 12 tokens


def test_relation_closure_declarations_per_arm():
    from gates.models.relation_closure import RelationClosureConfig

    study = get_study("relation_closure")
    tree = RelationClosureConfig(leaves=64)
    assert study.metric_range("visited_nodes", tree) == (0.0, 127.0)
    assert study.metric_range("dense_entropy", tree) == (0.0, pytest.approx(math.log(64)))
    assert study.chance("topk_recall_10", tree) == pytest.approx(10 / 64)
    assert study.chance("mass_kept_top_quarter_at_depth_2", tree) == 0.25
    ceiling = study.ceiling("mass_kept_top_quarter_at_depth_2", tree)
    assert ceiling.metric == "best_mass_top_quarter" and ceiling.value is None
    assert study.ceiling("mass_kept_top_half_at_depth_6", tree).metric == "best_mass_top_half"
    assert study.ceiling("leaf_kl", tree) is None
    dense = RelationClosureConfig(leaves=64, parent="dense")
    assert study.ceiling("mass_kept_top_half_at_depth_1", dense) is None
    assert "closure_error" not in study.reported_metrics(
        dense
    ) and "latency_ms" in study.reported_metrics(dense)
    assert {"latency_ms", "beam_width", "fit_topk_recall_10"} <= study.reported_metrics(
        RelationClosureConfig(leaves=64, read="beam")
    )
    assert "fit_topk_recall_10" not in study.reported_metrics(
        RelationClosureConfig(leaves=64, read="beam", beam_width=4)
    )
    assert study.regime_fields == ("teacher", "teacher_layer", "query_set", "leaf_set")
    assert study.metrics["kl_at_depth_1"].unit == study.metrics["kl_at_depth_6"].unit == "nats"
    assert (
        study.metrics["closure_error"].scale == "log"
        and study.metrics["mass_kept_top_half_at_depth_1"].scale == "linear"
    )


def test_studies_that_do_not_train():
    assert get_study("spr_hash").trains is False and get_study("biic_algebra").trains is False
    assert all(get_study(name).trains for name in OWN if name not in ("spr_hash", "biic_algebra"))


# ------------------------------------------------------------------------------------ tiny runs
@pytest.fixture(scope="module")
def teacher_config(tmp_path_factory):
    with tiny_teacher(tmp_path_factory.mktemp("declarations")) as config:
        yield config


CLOSURE_ARMS = {
    "soft": {},
    "random": dict(parent="single_key", topology="random"),
    "beam": dict(read="beam"),
    "beam_set": dict(read="beam", beam_width=4),
    "drilldown": dict(parent="lowrank", read="drilldown"),
    "dense": dict(parent="dense"),
    "bank_fast_beam": dict(leaf_set="bank", leaves=64, trees=1, read="fast_beam"),
    "continuation": dict(
        leaves=16, query_set="continuation", fit_queries=20, eval_queries=20, val_queries=8
    ),
}


@pytest.mark.parametrize("arm", list(CLOSURE_ARMS))
def test_relation_closure_runs_report_exactly_what_they_promise_and_the_best_mass_bounds_mass_kept(
    teacher_config, arm
):
    from gates.models.relation_closure import RelationClosureConfig

    study = get_study("relation_closure")
    config = RelationClosureConfig(
        **{
            **dict(
                teacher=teacher_config,
                leaves=32,
                trees=4,
                fit_queries=256,
                eval_queries=64,
                batch=64,
            ),
            **CLOSURE_ARMS[arm],
        }
    )
    metrics = study.run(config, 0, NullReporter(Budget(20, 10)))
    assert set(metrics) == study.reported_metrics(config)
    for metric, value in metrics.items():
        low, high = study.metric_range(metric, config)
        assert (
            inside(value, low, high) or abs(value - (high if high is not None else low)) < 1e-6
        ), (metric, value)
    for metric in metrics:
        ceiling = study.ceiling(metric, config)
        if (
            ceiling is not None
        ):  # the leaves a read keeps hold at most the mass of the best leaves as many
            assert metrics[ceiling.metric] >= metrics[metric] - 1e-6, metric
    if arm != "dense":
        assert metrics["best_mass_top_half"] >= metrics["best_mass_top_quarter"] >= 0.25
        assert metrics["best_mass_top_half"] >= 0.5


def translator_pairs(folder: Path) -> Path:
    rows = translator_rows()
    path = folder / "pairs.tsv"
    path.write_text("\n".join(rows) + "\n")
    return path


def tiny_translator(pairs: Path, **overrides):
    from gates.models.treeheap_translator import TranslatorConfig

    return TranslatorConfig(
        **{
            **dict(
                arm="lifting",
                corpus=str(pairs),
                vocab_size=120,
                depth=4,
                d_model=16,
                hidden=16,
                read_dim=8,
                merge_hidden=11,
                relation_rank=4,
                attn_hidden=16,
                gru_hidden=8,
                ffn_hidden=16,
                heads=2,
                batch_size=16,
                valid_examples=32,
                bleu_examples=10,
                samples=2,
                valid_fraction=0.1,
                test_fraction=0.1,
            ),
            **overrides,
        }
    )


@pytest.mark.usefixtures("one_thread")
def test_translator_arms_report_exactly_what_they_promise(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEHEAP_GATES_CACHE", str(tmp_path / "cache"))
    pairs = translator_pairs(tmp_path)
    study = get_study("treeheap_translator")
    for arm in (
        "lifting",
        "mlp",
        "bilinear",
        "root_only",
        "flat_seq",
        "target_only",
        "all_nodes",
        "bahdanau",
        "transformer_enc",
    ):
        for keep_best in (False, True):
            config = tiny_translator(pairs, arm=arm, keep_best=keep_best)
            assert set(study.run(config, 0, NullReporter(Budget(2, 1)))) == study.reported_metrics(
                config
            ), arm


@pytest.mark.usefixtures("one_thread")
def test_translator_dropout_and_weight_decay_act_only_when_set(tmp_path, monkeypatch):
    """0 (the default) is exactly the model every recorded run trained; dropout > 0 changes training but not
    evaluation (two evaluations of one trained model agree), weight decay > 0 changes the weights."""
    from gates.models.treeheap_translator import Translator, load_data, mean_nll

    monkeypatch.setenv("TREEHEAP_GATES_CACHE", str(tmp_path / "cache"))
    pairs = translator_pairs(tmp_path)
    study = get_study("treeheap_translator")
    machine = study.machine_metrics

    def run(**overrides):
        reporter = NullReporter(Budget(3, 1))
        final = study.run(tiny_translator(pairs, **overrides), 0, reporter)
        return {k: v for k, v in final.items() if k not in machine}, [
            m["train_loss"] for _, m in reporter.history
        ]

    plain, plain_losses = run()
    assert run(dropout=0.0, weight_decay=0.0) == (plain, plain_losses)
    dropped, dropped_losses = run(dropout=0.3)
    assert dropped_losses != plain_losses and dropped["test_nll"] != plain["test_nll"]
    decayed, _ = run(weight_decay=0.5, lr=0.01)
    assert decayed["test_nll"] != run(lr=0.01)[0]["test_nll"]

    config = tiny_translator(pairs, dropout=0.5)
    data = load_data(config)
    model = Translator(config, data.vocab_size)
    test = data.splits["test"][:32]
    assert mean_nll(model, test, 16)[0] == mean_nll(model, test, 16)[0]  # eval mode: no dropout
    assert study.hyperparameters >= {"lr", "dropout", "weight_decay"}


BUTTERFLY_CONFIGS = {
    "default": {},
    "no_short": dict(short_lengths=[], short_fraction=0.0),
    "messages": dict(messages=3, distances=[1, 2, 5, 8], short_lengths=[8, 12]),
    "messages_no_short": dict(
        messages=3, distances=[1, 2, 5, 8, 15], short_lengths=[], short_fraction=0.0
    ),
    "near_only": dict(distances=[0, 1, 2], short_lengths=[3, 9]),
}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", list(BUTTERFLY_CONFIGS))
def test_butterfly_runs_report_at_least_what_they_promise(name):
    """Exactly, with one message per example; with several, other pairs may add distances beyond the promise."""
    from gates.models.butterfly_reach import ButterflyReachConfig

    study = get_study("butterfly_reach")
    for arm in ("butterfly", "root_bottleneck"):
        config = ButterflyReachConfig(
            arm=arm,
            d_model=8,
            hidden=8,
            batch_size=16,
            test_examples=8,
            val_examples=16,
            **BUTTERFLY_CONFIGS[name],
        )
        reported = set(study.run(config, 1, NullReporter(Budget(2, 1))))
        promised = study.reported_metrics(config)
        assert promised <= reported <= set(study.metrics), (name, arm, sorted(promised - reported))
        if config.messages == 1:
            assert reported == promised, (name, arm)


@pytest.mark.usefixtures("one_thread")
def test_c05_and_twin_tree_runs_report_every_metric():
    from gates.models.c05_probe import C05ProbeConfig

    c05 = get_study("c05_probe")
    config = C05ProbeConfig(train_trees=60, test_trees=30, val_trees=20)
    assert (
        set(c05.run(config, 0, NullReporter(Budget(4, 2))))
        == c05.reported_metrics(config)
        == set(c05.metrics)
    )
    twin = get_study("twin_tree")
    config = twin.Config(batch_size=4)
    assert set(twin.run(config, 0, NullReporter(Budget(4, 2)))) == twin.reported_metrics(config)


@pytest.mark.usefixtures("one_thread")
def test_language_model_and_hash_runs_report_exactly_what_they_promise(tmp_path, monkeypatch):
    from gates.models.bif_lm import BifLMConfig
    from gates.models.biic_lm import BiicAlgebraConfig, BiicLMConfig
    from gates.models.spr_hash import SprHashConfig
    from tests.test_bif_lm import help_like_lines
    from tests.test_biic_lm import TINY

    monkeypatch.setenv("TREEHEAP_GATES_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "help.txt"
    corpus.write_text("\n".join(help_like_lines(3000)) + "\n")
    biic = get_study("biic_lm")
    for arm in ("biic", "grade0_only", "scalar_wide", "transformer", "sfe_v10", "sfe_v11"):
        config = BiicLMConfig(**{**TINY, "arm": arm, "corpus": str(corpus)})
        assert set(biic.run(config, 0, NullReporter(Budget(2, 1)))) == biic.reported_metrics(
            config
        ), arm
    bif = get_study("bif_lm")
    for arm in ("baseline", "bif", "bif_ablation"):
        config = BifLMConfig(
            arm=arm,
            corpus=str(corpus),
            vocab_size=100,
            seq_len=16,
            val_windows=4,
            d_model=32,
            layers=2,
            heads=2,
            mlp_hidden=32,
            alpha_dim=16,
            batch_size=4,
        )
        assert set(bif.run(config, 0, NullReporter(Budget(2, 1)))) == bif.reported_metrics(
            config
        ), arm
    algebra = get_study("biic_algebra")
    config = BiicAlgebraConfig(samples=8, transformations=4)
    assert set(algebra.run(config, 0, NullReporter(Budget(1, 1)))) == algebra.reported_metrics(
        config
    )
    spr = get_study("spr_hash")
    config = SprHashConfig(corpus=str(corpus), vocab_size=200, sentences=20)
    assert set(spr.run(config, 0, NullReporter(Budget(1, 1)))) == spr.reported_metrics(config)
