"""Bounds in the schema (issue #28): every step budget, seed, count and list a contract declares is
bounded by what one machine can honour and refused at load with a one-line error (exit 2), and no
preflight lists a range of steps one by one: a huge budget once made `gates check` hang."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

from gates.contract import load_contract
from gates.contract._bounds import (
    MAX_EVALUATIONS,
    MAX_ITEMS,
    MAX_LOOKS,
    MAX_SEEDS,
    MAX_STEPS,
    MAX_TRIALS,
)
from gates.errors import UserError
from gates.execution import preflight
from gates.study import Budget
from tests.conftest import c05_current, small_c05, write_contract


def refused(tmp_path, data: dict) -> str:
    """The loader's rendered error for `data`, which it must refuse."""
    with pytest.raises(UserError) as info:
        load_contract(write_contract(tmp_path, data))
    return info.value.render()


@pytest.fixture
def no_step_listing(monkeypatch):
    """Fail as soon as anything asks, step by step, whether a step is an evaluation: the preflight's
    numbers must be computed, so that they cost the same at any budget the schema allows. Returns the
    real rule, for a test to list a small budget's evaluations itself."""
    rule = Budget.is_eval_step

    def listed(self, step):
        raise AssertionError(f"asked whether step {step} is an evaluation: the steps were listed")

    monkeypatch.setattr(Budget, "is_eval_step", listed)
    return rule


# ---------------------------------------------------------------------------------- steps
def test_a_huge_budget_is_refused_in_one_line_with_exit_2(tmp_path):
    data = c05_current()  # passes today's design rules and has a convergence rule
    data["id"] = "c05-huge-steps"
    data["budget"]["steps"] = 2**63 - 1
    path = write_contract(tmp_path, data, "c05-huge-steps.yaml")
    # before the bound, the preflight listed every step and never returned: the timeout fails the test
    done = subprocess.run(
        [sys.executable, "-m", "gates", "check", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    error = done.stderr.strip()
    assert "\n" not in error and "Traceback" not in error
    assert error.startswith(f"error: {path}:") and "budget.steps: " in error
    assert f"less than or equal to {MAX_STEPS}, got {2**63 - 1}" in error


def test_the_largest_budget_passes_the_convergence_preflight(tmp_path, no_step_listing):
    data = c05_current()
    data["id"] = "c05-max-steps"
    every = MAX_STEPS // MAX_EVALUATIONS  # the most evaluations a run may make
    window = MAX_STEPS // 10
    data["budget"] = {"steps": MAX_STEPS, "eval_every": every}
    data["convergence"]["window"] = window
    data["stop_rules"]["futility"][0].update(at_step=MAX_STEPS // 2, window=window)
    report = preflight(load_contract(write_contract(tmp_path, data)))
    assert not report.errors, [e.render() for e in report.errors]
    assert any(
        f"from the evaluation at step {MAX_STEPS - window} to the last at step {MAX_STEPS} "
        f"(window {window} steps, eval every {every})" in note
        for note in report.notes
    ), report.notes


@pytest.mark.parametrize(
    "steps, every, window",
    [
        (60, 20, 20),  # the window ends on an evaluation
        (65, 20, 20),  # a last step off the grid: 65 - 20 = 45 starts from the evaluation at 40
        (65, 20, 45),  # exactly the first evaluation
        (100, 30, 40),  # 60 is the latest evaluation at or before 100 - 40
        (101, 25, 25),  # 101 - 25 = 76 is off the grid: the window starts at 75
    ],
)
def test_the_convergence_window_is_computed_as_listing_would_find_it(
    tmp_path, no_step_listing, steps, every, window
):
    budget = Budget(steps, every)
    evals = [s for s in range(1, steps + 1) if no_step_listing(budget, s)]
    start = max(s for s in evals if s <= evals[-1] - window)
    data = small_c05(
        budget={"steps": steps, "eval_every": every},
        convergence={"metric": "train_loss", "window": window, "max_rel_improvement": 0.01},
    )
    data["stop_rules"]["futility"] = []
    report = preflight(load_contract(write_contract(tmp_path, data)))
    assert not report.errors, [e.render() for e in report.errors]
    assert any(
        f"from the evaluation at step {start} to the last at step {steps} " in n
        for n in report.notes
    )


# ---------------------------------------------------------------------------------- seeds
def tuned() -> dict:
    """The small C05 contract with a tuning section (random sampler)."""
    data = small_c05()
    data["tuning"] = {
        "space": {"lr": {"type": "float", "low": 0.003, "high": 0.03, "log": True}},
        "trials": 2,
        "objective": {"metric": "val_acc", "direction": "higher"},
        "seeds": [7],
        "sampler": {"kind": "random", "seed": 0},
    }
    return data


def _with(path: str, value, base=small_c05) -> dict:
    """`base()`'s contract with the value at a dotted path (list indices as numbers) set."""
    data = base()
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = data
    for p in parents:
        node = node.setdefault(p, {}) if isinstance(node, dict) else node[p]
    node[last] = value
    return data


def _copies(path: str, n: int) -> dict:
    """small_c05 with `n` distinct items made from the first of the list or mapping at `path` (copies,
    not shared objects: YAML would write those as aliases, which the loader caps)."""
    data = small_c05()
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node[p]
    items = node[last]
    if isinstance(items, dict):
        first = next(iter(items.values()))
        node[last] = {f"x{i}": copy.deepcopy(first) for i in range(n)}
    else:
        node[last] = [copy.deepcopy(items[0]) for _ in range(n)]
    return data


@pytest.mark.parametrize(
    "data, field, expected",
    [
        # a count is refused before its seeds are listed (`seeds: 10**12` would fill memory)
        pytest.param(
            _with("seeds", MAX_SEEDS + 1),
            "seeds",
            f"is not a count from 1 to {MAX_SEEDS}",
            id="count",
        ),
        pytest.param(
            _with("seeds", {"count": MAX_SEEDS + 1}),
            "seeds",
            f"1 <= N <= {MAX_SEEDS}",
            id="count-start",
        ),
        # one error for a range past 2**31, not one per seed beyond it
        pytest.param(
            _with("seeds", {"count": 5, "start": 2**31 - 2}),
            "seeds",
            "0 <= S <= 2**31 - N",
            id="start-past-2**31",
        ),
        pytest.param(
            _with("seeds", list(range(MAX_SEEDS + 1))),
            "seeds",
            f"at most {MAX_SEEDS} items",
            id="list",
        ),
        pytest.param(
            _with("tuning.seeds", list(range(100, 101 + MAX_SEEDS)), tuned),
            "tuning.seeds",
            f"at most {MAX_SEEDS} items",
            id="tuning-seeds",
        ),
        # the sampler seed seeds numpy (SeedSequence refuses a negative one, at run time)
        pytest.param(
            _with("tuning.sampler.seed", -1, tuned),
            "tuning.sampler.seed",
            "seed -1 is outside 0 <= seed < 2**31",
            id="sampler-negative",
        ),
        pytest.param(
            _with("tuning.sampler.seed", 2**31, tuned),
            "tuning.sampler.seed",
            "seed 2147483648 is outside 0 <= seed < 2**31",
            id="sampler-2**31",
        ),
        pytest.param(
            _with("tuning.sampler.seed", 1.0, tuned),
            "tuning.sampler.seed",
            "input should be a valid integer",
            id="sampler-float",
        ),
    ],
)
def test_seeds_out_of_range_or_too_many_are_refused_in_one_line(tmp_path, data, field, expected):
    message = refused(tmp_path, data)
    assert "\n" not in message and f": {field}: " in message and expected in message, message


# ---------------------------------------------------------------------------------- other bounds
@pytest.mark.parametrize(
    "data, field, expected",
    [
        pytest.param(
            _with("budget.eval_every", 2**40),
            "budget.eval_every",
            f"or equal to {MAX_STEPS}",
            id="eval_every",
        ),
        pytest.param(
            _with("budget", {"steps": 2 * MAX_EVALUATIONS, "eval_every": 1}),
            "budget",
            f"make {2 * MAX_EVALUATIONS} evaluations per run; expected at most {MAX_EVALUATIONS} "
            f"(eval_every >= 2)",
            id="evaluations",
        ),
        *(
            pytest.param(_with(path, MAX_STEPS + 1), path, f"or equal to {MAX_STEPS}", id=path)
            for path in (
                "preflight.falsifiable_point.by_step",
                "stop_rules.futility.0.at_step",
                "stop_rules.futility.0.window",
                "convergence.window",
            )
        ),
        pytest.param(
            _with("stop_rules.failures.max_consecutive", MAX_SEEDS + 1),
            "stop_rules.failures.max_consecutive",
            f"or equal to {MAX_SEEDS}",
            id="max_consecutive",
        ),
        pytest.param(
            _with("sequential.looks", [2, MAX_SEEDS + 1]),
            "sequential.looks.1",
            f"or equal to {MAX_SEEDS}",
            id="look",
        ),
        pytest.param(
            _with("sequential.looks", list(range(2, MAX_LOOKS + 3))),
            "sequential.looks",
            f"at most {MAX_LOOKS} items",
            id="looks",
        ),
        pytest.param(
            _with("tuning.trials", MAX_TRIALS + 1, tuned),
            "tuning.trials",
            f"at most {MAX_TRIALS}",
            id="trials",
        ),
        pytest.param(
            _with("tuning.trials", {"path_only": MAX_TRIALS + 1}, tuned),
            "tuning.trials",
            f"at most {MAX_TRIALS}",
            id="trials-by-arm",
        ),
        pytest.param(
            _with(
                "tuning.space.lr",
                {"type": "categorical", "choices": [*range(MAX_ITEMS + 1)]},
                tuned,
            ),
            "tuning.space.lr.choices",
            f"at most {MAX_ITEMS} items",
            id="choices",
        ),
        pytest.param(
            _copies("arms", MAX_ITEMS + 1), "arms", f"at most {MAX_ITEMS} items", id="arms"
        ),
        pytest.param(
            _copies("decision.refuted_if", MAX_ITEMS + 1),
            "decision.refuted_if",
            f"at most {MAX_ITEMS} items",
            id="conditions",
        ),
    ],
)
def test_counts_past_what_a_machine_can_honour_are_refused(tmp_path, data, field, expected):
    lines = refused(tmp_path, data).splitlines()
    assert any(f": {field}: " in line and expected in line for line in lines), lines
