"""Every registered study declares each metric's direction, role and range (gates.study.Metric)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gates.cli import app
from gates.study import ROLES, Metric, get_study, study_names

STUDIES = study_names()


def test_studies_are_registered():
    assert {
        "c05_probe",
        "relation_closure",
        "bif_lm",
        "spr_hash",
        "twin_tree",
        "treeheap_translator",
    } <= set(STUDIES)


@pytest.mark.parametrize("name", STUDIES)
def test_every_metric_is_a_metric_with_a_valid_role(name):
    study = get_study(name)
    assert study.metrics, f"{name} declares no metrics"
    for metric, spec in study.metrics.items():
        assert isinstance(spec, Metric), f"{name}.{metric} is {spec!r}, not a Metric"
        assert spec.role in ROLES
        assert spec.direction in ("higher", "lower")
    assert set(getattr(study, "machine_metrics", ())) <= set(study.metrics)


@pytest.mark.parametrize("name", STUDIES)
def test_named_roles_follow_the_metric_names(name):
    """The naming convention and the declared role never contradict each other."""
    for metric, spec in get_study(name).metrics.items():
        if metric.startswith(("val_", "valid_", "validation_")):
            assert spec.role == "validation", metric
        if metric.startswith(("train_loss", "train_acc", "fit_loss")):
            assert spec.role == "train", metric
        if metric.startswith("test_"):
            assert spec.role == "test", metric


def test_gates_studies_shows_direction_role_and_range():
    result = CliRunner().invoke(app, ["studies", "--metrics"])
    assert result.exit_code == 0, result.output
    for name in STUDIES:
        assert f"{name}:" in result.output
        for metric, spec in get_study(name).metrics.items():
            assert f"{metric}: {spec.describe()}" in result.output
    assert "test_acc: higher, test, range [0, 1]" in result.output
    assert "val_loss: lower, validation, range [0, inf]" in result.output


def test_a_returned_value_outside_its_range_fails_the_run_but_rounding_at_the_bound_does_not():
    """A run returning nonsense (accuracy 1.7) has failed; BLEU of a perfect match computed as
    100.00000000000004 by sacrebleu is a measurement at the bound, not nonsense (the twin-tree toy)."""
    from gates.execution._study_run import StudyInterfaceError, returned_metrics
    from gates.study import Metric

    class Scores:
        metrics = {
            "bleu": Metric("higher", "test", 0.0, 100.0),
            "acc": Metric("higher", "test", 0.0, 1.0),
        }

        def reported_metrics(self, config):
            return frozenset(self.metrics)

    study = Scores()
    assert (
        returned_metrics("s", study, {"bleu": 100.00000000000004, "acc": 1.0}, config=object())[
            "bleu"
        ]
        > 100
    )
    with pytest.raises(
        StudyInterfaceError, match=r"returned acc = 1.7, outside its declared range"
    ):
        returned_metrics("s", study, {"bleu": 50.0, "acc": 1.7}, config=object())
    with pytest.raises(
        StudyInterfaceError, match=r"did not return acc, which the study says this arm reports"
    ):
        returned_metrics("s", study, {"bleu": 50.0}, config=object())
