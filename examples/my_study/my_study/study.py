"""Logistic regression on points inside or outside a circle: do quadratic features help?

A minimal gates study: a config model, declared metrics, a parameter count and `run`, which trains
with numpy and reports through the reporter (a stop rule may halt it there).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from gates.study import Ceiling, Metric, Reporter, Study, StudyConfig, nonnegative, proportion


class MyConfig(StudyConfig):  # one arm; strict and frozen: unknown fields are refused
    features: Literal["linear", "quadratic"] = "quadratic"
    lr: float = Field(default=1.0, gt=0)
    n_train: int = Field(default=400, ge=10)
    n_test: int = Field(default=400, ge=10)
    label_noise: float = Field(default=0.05, ge=0, lt=0.5)


def make_data(rng, n, noise):
    x = rng.uniform(-1, 1, size=(n, 2))
    y = (x**2).sum(axis=1) < 0.5  # inside the circle
    return x, (y ^ (rng.random(n) < noise)).astype(float)


def features(x, kind):
    cols = [np.ones(len(x)), x[:, 0], x[:, 1]]
    if kind == "quadratic":
        cols += [x[:, 0] ** 2, x[:, 1] ** 2, x[:, 0] * x[:, 1]]
    return np.stack(cols, axis=1)


class MyStudy(Study):
    """Circle task: logistic regression with linear or quadratic features."""

    name: ClassVar[str] = "my_study"  # the entry point's name
    Config: ClassVar[type[StudyConfig]] = MyConfig
    metrics: ClassVar[dict[str, Metric]] = {  # every metric run() reports or returns
        "train_loss": nonnegative("lower", "train"),  # better lower, role train, range [0, inf]
        "test_acc": proportion("higher", "test"),  # better higher, role test, range [0, 1]
    }
    hyperparameters: ClassVar[frozenset[str]] = frozenset(
        {"lr"}
    )  # what a contract's `tuning` may search

    def chance(
        self, metric, config
    ):  # the majority class (outside): P(inside) = pi 0.5 / 4, then noise
        inside = np.pi / 8 * (1 - config.label_noise) + (1 - np.pi / 8) * config.label_noise
        return max(inside, 1 - inside) if metric == "test_acc" else None

    def ceiling(self, metric, config):  # what the best possible classifier reaches
        if metric == "test_acc":
            return Ceiling(
                f"{config.label_noise:.0%} of labels flipped: no classifier exceeds 1 - label_noise "
                "in expectation",
                value=1 - config.label_noise,
            )
        return None

    def param_count(self, config):  # measured by gate 1 (compute cost)
        return 6 if config.features == "quadratic" else 3

    def run(self, config, seed, reporter: Reporter) -> dict[str, float]:
        rng = np.random.default_rng(seed)  # everything random comes from the seed
        x_train, y_train = make_data(rng, config.n_train, config.label_noise)
        x_test, y_test = make_data(rng, config.n_test, config.label_noise)
        f_train, f_test = features(x_train, config.features), features(x_test, config.features)
        w, metrics = np.zeros(f_train.shape[1]), {}
        for step in range(1, reporter.budget.steps + 1):  # the contract's budget
            p = 1 / (1 + np.exp(-f_train @ w))
            w -= config.lr * f_train.T @ (p - y_train) / len(y_train)
            if reporter.budget.is_eval_step(step):
                p = np.clip(1 / (1 + np.exp(-f_train @ w)), 1e-12, 1 - 1e-12)
                metrics = {
                    "train_loss": float(
                        -np.mean(y_train * np.log(p) + (1 - y_train) * np.log(1 - p))
                    ),
                    "test_acc": float(np.mean((f_test @ w > 0) == (y_test > 0.5))),
                }
                reporter.report(step, metrics)  # stop rules may raise Halt here: let it propagate
        return metrics  # the final metrics: declared names, numbers
