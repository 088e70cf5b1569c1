"""Design rules: what a contract must get right before any run for its verdict to mean anything.

A verdict can be computed correctly and still test nothing: a bar every arm at chance clears, a
baseline that fails by construction, a comparator handicapped by a setting nobody declared, seeds
picked after a private run. Each rule here refuses a class of such designs at `gates check` (one line
naming the file, line and field). Rules came after some contracts were recorded: a contract without
evidence must follow them (`require_current_rules`), a recorded one keeps loading and
verifying and is flagged wherever it is shown ("recorded under older rules: ...").

`rule_errors(loaded)` runs them all on a loaded contract (`check_rules` on its parts).
"""

from __future__ import annotations

import re
import weakref
from pathlib import Path

from gates.contract import (
    Compare,
    Contract,
    LoadedContract,
    Threshold,
    Trend,
    arms_under_test,
    condition_terms,
    is_contiguous,
    metric_locs,
)
from gates.errors import UserError, UserErrors
from gates.study import CONTROL_ROLES, DECISION_ROLES, Study

# what a claim's words name: a mean (arithmetic or geometric: the metric's scale decides which), a
# median, a share of seeds
ESTIMAND_WORDS = {
    "mean": re.compile(r"\b(?:mean|average|averaged|on average)\b", re.IGNORECASE),
    "median": re.compile(r"\bmedians?\b", re.IGNORECASE),
    "proportion": re.compile(
        r"\b(?:share|proportion|fraction|majority)\s+of\s+(?:the\s+)?seeds\b", re.IGNORECASE
    ),
}

# A non-inferiority margin ("no worse than the other by more than |margin|") wider than this share of a
# bounded metric's declared range lets almost any result pass: on an accuracy, an arm 0.2 below its
# comparator is a worse arm, not one "no worse". A tenth of the range is already generous for a claim of
# equivalence; a narrower margin is the author's to choose.
NON_INFERIORITY_SHARE = 0.1

# An arm asserted to beat another at more than this multiple of its measured parameters or FLOPs makes a
# claim about compute as much as about design: a reviewer asks for a comparator of matched cost. The
# declared bound of gate 1 (`max_ratio`, against a baseline arm of the author's choosing) cannot hide
# it: an arm far cheaper than the baseline leaves every arm within the bound and the pair far apart.
MAX_COMPARED_COST_RATIO = 2.0

# each rule's short name, which ends its messages "(rule: ...)" and names it in flags of recorded contracts
RULES = {
    "roles": "decisions read only test and cost metrics, controls also validation ones",
    "ranges_and_chance": "no bar outside the arm's range or cleared by an arm at chance",
    "scales": "metrics compared on their declared scale and unit",
    "estimands": "each condition estimates what the claim's words name, by a test valid on its metrics",
    "controls": "a positive control asserts its arm works",
    "negative_controls": "a negative control's bar lies between chance and the positive controls' bars",
    "negative_results": "negative results need a working arm",
    "blind_comparators": "no claim to beat an arm blind by construction",
    "non_inferiority": "a non-inferiority margin within the smallest effect of interest and a tenth of the range",
    "compute": "an arm asserted to beat another costs at most twice its parameters and FLOPs",
    "ceilings": "no bar beyond a known ceiling",
    "comparisons": "compared arms differ only in the declared factor",
    "identical_arms": "no two arms with one config",
    "prediction": "conditions follow the predicted direction",
    "falsifiable_point": "supported_if bars at least as strict as the falsifiable point",
    "refutation": "each refutation mirrors a supported_if condition or says what it refutes",
    "futility": "futility rules halt only arms under test",
    "seeds": "seeds are a count",
    "reported": "conditions read metrics the arm reports",
    "tuning": "tuning searches only declared hyperparameters",
    "convergence": "a training study's contract judges convergence",
    "reachable": "conditions can reach significance with the seeds",
}


def rule_errors(loaded: LoadedContract) -> list[UserError]:
    """The design rules this contract breaks, each an error at its file, line and field (computed once
    per loaded contract). Rules added after a contract was recorded may flag it: a contract without
    evidence must break none (`require_current_rules`); a recorded one keeps loading and is flagged
    wherever it is shown (`rule_flags`)."""
    if loaded not in _REVIEWED:
        _REVIEWED[loaded] = check_rules(
            loaded.contract, loaded.study, loaded.arm_configs, loaded.error
        )
    return _REVIEWED[loaded]


def rule_flags(loaded: LoadedContract) -> list[str]:
    """`rule_errors` as lines ("field: message (rule: name)"), as evidence records them."""
    return [f"{e.field}: {e.message}" if e.field else e.message for e in rule_errors(loaded)]


def require_current_rules(loaded: LoadedContract, runs_root: Path) -> None:
    """Refuse a contract that breaks a rule, unless its evidence was recorded before the rule."""
    errors = rule_errors(loaded)
    if errors and not loaded.recorded_in(runs_root):
        raise UserErrors(errors)


_REVIEWED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_rules(contract: Contract, study: Study, arm_configs: dict, err) -> list[UserError]:
    """Every design rule's errors for this contract (empty when it follows them all)."""
    rules = _Rules(contract, study, arm_configs, err)
    for name, rule in RULES.items():
        rules.current = rule
        getattr(rules, name)()
    return rules.errors


class _Rules:
    def __init__(self, contract: Contract, study: Study, arm_configs: dict, err):
        self.c, self.study, self.configs, self.err = contract, study, arm_configs, err
        self.errors: list[UserError] = []
        self.current = ""  # the rule being checked (its short name)
        self.located = [(("decision", name, i), c) for name, i, c in contract.conditions()] + [
            (("controls", i), c) for i, c in enumerate(contract.controls)
        ]

    def add(self, loc: tuple, msg: str, at: tuple | None = None) -> None:
        """An error at field `loc`; `at`: the field whose line it is said at, when `loc` may be absent
        from the file (a missing `differences`: the line of the arm's value that needs it)."""
        if "(rule: " not in msg:
            msg = f"{msg} (rule: {self.current})"
        error = self.err(loc, msg)
        if at is not None:
            error.line = self.err(at, msg).line
        self.errors.append(error)

    # ------------------------------------------------------------------ what a metric is
    def spec(self, metric: str):
        return self.study.metrics.get(metric)

    def span(self, arm: str, metric: str) -> tuple[float | None, float | None]:
        """The range `arm` can reach on `metric`: the study's tighter one for the arm's config, else declared."""
        if self.spec(metric) is None:
            return None, None
        config = self.configs.get(arm)
        return (
            self.study.metric_range(metric, config)
            if config is not None
            else (self.spec(metric).low, self.spec(metric).high)
        )

    def chance(self, arm: str, metric: str) -> float | None:
        config = self.configs.get(arm)
        return (
            self.study.chance(metric, config) if config is not None and self.spec(metric) else None
        )

    def better(self, c) -> bool:
        """Whether a threshold or compare asserts its `arm` is good (the metric's better direction)."""
        spec = self.spec(c.metric)
        return spec is not None and c.direction == spec.direction

    # ------------------------------------------------------------------ the rules
    def roles(self) -> None:
        """Decisions read only held-out test and cost metrics; controls may also read validation metrics
        (an arm works where it can: held-out data of its own distribution), never a train metric."""
        for base, c in self.located:
            allowed, who = (
                (CONTROL_ROLES, "a control")
                if base[0] == "controls"
                else (DECISION_ROLES, "the decision")
            )
            for loc, metric in metric_locs(c):
                spec = self.spec(metric)
                if spec is not None and spec.role not in allowed:
                    self.add(
                        base + loc,
                        f"{who} reads {metric!r}, a {spec.role} metric of study {self.study.name!r}; "
                        f"expected a {' or '.join(allowed)} metric",
                    )

    def ranges_and_chance(self) -> None:
        """No condition (or control) holds, or cannot hold, for every value its arm can reach; none that
        asserts an arm is good is cleared by an arm at chance."""
        exact = self.c.decision.evaluation == "exact"
        for base, c in self.located:
            vacuous = self.vacuous(c, exact)
            for loc, msg in vacuous:
                self.add(base + loc, msg)
            if isinstance(c, Threshold) and self.better(c) and not vacuous:  # one line per bar
                level = self.chance(c.arm, c.metric)
                passes = level is not None and (
                    level >= c.value if c.direction == "higher" else level <= c.value
                )
                if passes:
                    self.add(
                        base + ("value",),
                        f"an arm that learned nothing ({c.metric} at chance, {level:.4g}) "
                        f"already satisfies {c.metric} {'>=' if c.direction == 'higher' else '<='} "
                        f"{c.value:g}: the condition tests nothing; expected a bar beyond chance",
                    )

    def vacuous(self, c, inclusive: bool) -> list[tuple[tuple, str]]:
        """(field, why) when a condition holds, or cannot hold, for every value its arms can reach. A
        statistical test needs the bar strictly inside the range (theta = 0 is no evidence); exact
        evaluation (`inclusive`) holds at the bar itself, so there a bar at the range's end can hold."""

        def beyond(x, end):  # the bar leaves no value on the condition's side
            return end is not None and (x > end if inclusive else x >= end)

        if isinstance(c, Threshold):
            low, high = self.span(c.arm, c.metric)
            if c.direction == "lower":  # metric <= value
                always, never = (
                    high is not None and c.value >= high,
                    beyond(-c.value, None if low is None else -low),
                )
            else:
                always, never = low is not None and c.value <= low, beyond(c.value, high)
            what, shown = (
                f"{c.metric} {'<=' if c.direction == 'lower' else '>='} {c.value:g}",
                self.shown(c.arm, c.metric),
            )
        elif isinstance(c, Compare) and c.relative_margin is None:
            (low_a, high_a), (low_b, high_b) = (
                self.span(c.arm, c.metric),
                self.span(c.other, c.other_metric or c.metric),
            )
            m = c.margin or 0.0
            if c.direction == "higher":  # arm - other - m >= 0
                lo, hi = _diff_span(low_a, high_a, low_b, high_b)
            else:  # other - arm - m >= 0
                lo, hi = _diff_span(low_b, high_b, low_a, high_a)
            always, never = lo is not None and lo - m >= 0, beyond(m, hi)
            what, shown = f"margin {m:g}", self.shown(c.arm, c.metric)
        else:
            return []
        field = ("value",) if isinstance(c, Threshold) else ("margin",)
        if always:
            return [
                (
                    field,
                    f"{what} holds for every value the metric can take ({shown}): the condition tests "
                    f"nothing; expected a bar inside the metric's range",
                )
            ]
        if never:
            return [
                (
                    field,
                    f"{what} cannot hold for any value the metric can take ({shown}): a condition that can "
                    f"never hold (a statistical test needs the bar strictly inside the range)",
                )
            ]
        return []

    def shown(self, arm: str, metric: str) -> str:
        spec = self.spec(metric)
        if spec is None:
            return "?"
        low, high = self.span(arm, metric)
        if (low, high) != (spec.low, spec.high):
            return (
                f"{spec.describe()}; for arm {arm}: [{'-inf' if low is None else f'{low:g}'}, "
                f"{'inf' if high is None else f'{high:g}'}]"
            )
        return spec.describe()

    def scales(self) -> None:
        """A relative margin scales non-negative metrics only; a log-scale metric compares by ratio (a
        relative margin, or none); two different metrics are compared only on one declared unit, or
        paired within the same runs."""
        for base, c in self.located:
            if isinstance(c, Compare) and c.relative_margin is not None:
                for _, metric in metric_locs(c):
                    spec = self.spec(metric)
                    if spec is not None and not spec.nonnegative:
                        self.add(
                            base + ("relative_margin",),
                            f"a relative margin scales {metric!r}, which study {self.study.name!r} does not "
                            f"declare non-negative: with negative values a worse arm would hold; expected an "
                            f"absolute `margin`",
                        )
            if isinstance(c, Compare) and c.margin:
                logs = [m for _, m in metric_locs(c) if getattr(self.spec(m), "scale", "") == "log"]
                if logs:
                    self.add(
                        base + ("margin",),
                        f"{logs[0]!r} is a log-scale metric of study {self.study.name!r} "
                        f"(positive, right-skewed: judged by ratios of geometric means); "
                        f"expected a `relative_margin` instead of an absolute margin",
                    )
            for loc, metric in metric_locs(c):
                spec = self.spec(metric)
                if spec is not None and spec.skewed_linear:
                    self.add(
                        base + loc,
                        f"{metric!r} is positive, unbounded above and better lower (a loss, an error, a "
                        f"latency), but study {self.study.name!r} declares it linear without saying why: a "
                        f"t-test on right-skewed values does not keep its level (lognormal at the bar: "
                        f"20-24% false support); expected `positive(...)` (the log scale) or a "
                        f"`linear_reason` in the study's declaration",
                    )
            metrics = list(dict.fromkeys(m for _, m in condition_terms(c)))
            if len(metrics) > 1:
                units = {getattr(self.spec(m), "unit", None) for m in metrics}
                same_runs = (
                    getattr(c, "test", None) == "paired"
                    and len({a for a, _ in condition_terms(c)}) == 1
                )
                if not same_runs and (None in units or len(units) > 1):
                    self.add(
                        base,
                        f"compares different metrics ({', '.join(metrics)}) that study {self.study.name!r} "
                        f"does not declare on one unit; expected metrics with the same `unit`, or a paired "
                        f"test within one arm (the same runs)",
                    )

    def estimands(self) -> None:
        """Each condition's estimand has a test that keeps its level on its metrics (a geometric mean
        needs positive metrics and a ratio; no arithmetic mean of a right-skewed metric unbounded
        above), and a decision condition estimates what the claim's words (the claim, gates 3 and 5)
        name, or says why not (`estimand_reason`)."""
        from gates.inference import condition_estimand, log_able

        metrics = self.study.metrics
        pf = self.c.preflight
        words = " ".join(
            [self.c.claim, pf.predicted_ablation.statement, pf.falsifiable_point.statement]
        )
        named = {e for e, pattern in ESTIMAND_WORDS.items() if pattern.search(words)}
        for base, c in self.located:
            estimand = condition_estimand(c, metrics)
            if estimand == "geometric_mean" and not log_able(c, metrics):
                self.add(
                    base + ("estimand",),
                    "a geometric mean needs positive metrics (declared low >= 0) and a ratio (a "
                    "threshold above 0, a compare with a relative margin or none, a trend); expected "
                    "estimand mean or median",
                )
            skewed = [
                m
                for _, m in condition_terms(c)
                if (spec := metrics.get(m)) is not None
                and spec.scale == "log"
                and spec.high is None
            ]
            if c.estimand == "mean" and skewed:
                self.add(
                    base + ("estimand",),
                    f"the arithmetic mean of {skewed[0]!r}, a positive right-skewed metric unbounded "
                    f"above, has no test that keeps its level at a few seeds; expected estimand "
                    f"geometric_mean (its default) or median",
                )
            family = {"geometric_mean": "mean"}.get(estimand, estimand)
            if base[0] == "decision" and named and family not in named and not c.estimand_reason:
                self.add(
                    base + ("estimand",),
                    f"the claim's words speak of the {' or '.join(sorted(named))}, but this condition "
                    f"estimates the {estimand.replace('_', ' ')}; expected estimand "
                    f"{' or '.join(sorted(named))}, or an `estimand_reason` saying why it differs",
                )

    def controls(self) -> None:
        """A positive control asserts that its arm works: a threshold or compare in the metric's better
        direction (a compare: its `arm` beats `other`, margin >= 0), which an arm at chance fails."""
        for i, c in enumerate(self.c.controls):
            if c.control != "positive":
                continue
            if isinstance(c, Trend):
                self.add(
                    ("controls", i),
                    "a positive control asserts that one arm works; expected a threshold or "
                    "compare (a trend is a claim about several arms)",
                )
            elif not self.better(c):
                spec = self.spec(c.metric)
                self.add(
                    ("controls", i, "direction"),
                    f"a positive control must assert that {c.arm} works: {c.metric} is better "
                    f"{getattr(spec, 'direction', '?')}, so direction {getattr(spec, 'direction', '?')!r} (a "
                    f"broken arm must fail it); this one passes a broken arm",
                )
            elif isinstance(c, Compare) and (c.margin or 0) < 0:
                self.add(
                    ("controls", i, "margin"),
                    "a positive control asserts its arm beats the other; a "
                    "non-inferiority margin lets a broken arm pass it",
                )

    def working(self) -> set[str]:
        """Arms a positive control asserts work (rule `controls` checks the form)."""
        return {
            c.arm
            for c in self.c.controls
            if c.control == "positive" and not isinstance(c, Trend) and self.better(c)
        }

    def negative_controls(self) -> None:
        """A negative control (a threshold asserting its arm fails) is one its arm could fail: its bar lies
        on the chance side of every positive control's bar on its metric (else a working arm passes it
        too), and at or beyond the arm's chance level (else even an arm at chance fails it)."""
        positive: dict[str, list[float]] = {}  # metric -> bars of positive threshold controls
        for c in self.c.controls:
            if c.control == "positive" and isinstance(c, Threshold) and self.better(c):
                positive.setdefault(c.metric, []).append(c.value)
        for i, c in enumerate(self.c.controls):
            negative = c.control == "negative" and isinstance(c, Threshold)
            if not negative or not failing_arms(c, self.spec):
                continue
            better, bars = self.spec(c.metric).direction, positive.get(c.metric)
            # the positive bar nearest chance: the negative bar must lie beyond it on chance's side
            bar = (min if better == "higher" else max)(bars) if bars else None
            level = self.chance(c.arm, c.metric)
            if bar is not None and not _beyond(bar, c.value, better):
                why = (
                    f"a working arm passes it too (a positive control asks {_SIGN[better]} {bar:g})"
                )
            elif level is not None and _beyond(level, c.value, better):
                why = f"even an arm at chance ({level:.4g}) fails it"
            else:
                continue
            self.add(
                ("controls", i, "value"),
                f"the negative control {c.arm}.{c.metric} {_SIGN[c.direction]} {c.value:g} cannot tell a "
                f"working arm from one at chance: "
                f"{why}; expected a bar between the arm's chance level"
                f"{'' if level is None else f' ({level:.4g})'} and the positive control's bar"
                f"{'' if bar is None else f' ({bar:g})'}",
            )

    def negative_results(self) -> None:
        """A condition that asserts an arm fails (below a bar, worse than another arm) needs a positive
        control that the arm works where it can, or the arm declared `blind` (fails by construction)."""
        for arm in self.c.blind:
            if arm not in self.c.arms:
                self.add(("blind", arm), f"no arm named {arm!r}; arms: {', '.join(self.c.arms)}")
        working = self.working()
        for base, c in self.located:
            if base[0] == "controls":
                continue
            # a supported_if compare may not rest on a blind arm (rule `blind_comparators`)
            blind_ok = not (base[1] == "supported_if" and isinstance(c, Compare))
            for arm in failing_arms(c, self.spec):
                if arm in working or arm in self.c.blind:
                    continue
                what = (
                    f"compares with baseline arm {arm!r}"
                    if isinstance(c, Compare) and arm == c.other
                    else f"asserts that arm {arm!r} fails"
                )
                self.add(
                    base,
                    f"{what}, but no positive control asserts that it works where it can, so a broken "
                    f"arm would pass as evidence; expected a positive control on {arm!r} (on its "
                    f"validation data or training distribution, in its metric's better direction)"
                    + (f" or `blind: {{{arm}: why it fails by construction}}`" if blind_ok else ""),
                )

    def blind_comparators(self) -> None:
        """No supported_if compare asserts that an arm beats one declared `blind`: beating an arm that
        cannot do the task is true by construction. A blind arm may still appear in controls and in
        conditions asserting that it fails."""
        for i, c in enumerate(self.c.decision.supported_if):
            if not isinstance(c, Compare):
                continue
            for arm in failing_arms(c, self.spec):
                if arm in self.c.blind:
                    self.add(
                        ("decision", "supported_if", i, "other" if arm == c.other else "arm"),
                        f"asserts that {c.other if arm == c.arm else c.arm} beats arm {arm!r}, which the "
                        f"contract declares blind (it fails by construction): beating it is true by "
                        f"construction and tests nothing; expected a comparator that works where it can "
                        f"(with a positive control), or a threshold asserting that {arm!r} fails",
                    )

    def non_inferiority(self) -> None:
        """A supported_if non-inferiority margin (a compare's negative `margin`) is at most the smallest
        effect of interest the decision declares for its metric (`smallest_effects`), itself at most the
        predicted effect on that metric; on a metric with a declared range on both sides, the margin is
        also at most NON_INFERIORITY_SHARE of that range."""
        d, predicted = self.c.decision, self.c.preflight.predicted_ablation
        for metric in d.smallest_effects:
            if self.spec(metric) is None:
                self.add(
                    ("decision", "smallest_effects", metric),
                    f"{metric!r} is not a metric of study {self.study.name!r}",
                )
            elif metric == predicted.metric and d.smallest_effects[metric] > predicted.size:
                self.add(
                    ("decision", "smallest_effects", metric),
                    f"the smallest effect of interest {d.smallest_effects[metric]:g} exceeds the predicted "
                    f"effect {predicted.size:g} on {metric} (gate 3): the prediction itself would not "
                    f"matter; expected at most {predicted.size:g}",
                )
        for i, c in enumerate(d.supported_if):
            if not isinstance(c, Compare) or (c.margin or 0) >= 0:
                continue
            width, smallest = -c.margin, d.smallest_effects.get(c.metric)
            if smallest is None or width > smallest:
                self.add(
                    ("decision", "supported_if", i, "margin"),
                    f"the non-inferiority margin {width:g} on {c.metric} "
                    + (
                        "has no declared smallest effect of interest"
                        if smallest is None
                        else f"exceeds the declared smallest effect of interest {smallest:g}"
                    )
                    + f": 'no worse by more than {width:g}' must mean 'no worse by any difference that "
                    f"matters'; expected `decision.smallest_effects: {{{c.metric}: S}}` fixed before the "
                    f"run, with the margin at most S",
                )
            spec = self.spec(c.metric)
            if spec is None or spec.low is None or spec.high is None:
                continue
            limit = NON_INFERIORITY_SHARE * (spec.high - spec.low)
            if width > limit:
                self.add(
                    ("decision", "supported_if", i, "margin"),
                    f"the non-inferiority margin {width:g} is {width / (spec.high - spec.low):.0%} of the range "
                    f"of {c.metric} ({spec.describe()}): 'no worse by more than {width:g}' lets almost any "
                    f"result pass; expected a margin of at most {NON_INFERIORITY_SHARE:.0%} of the range "
                    f"({limit:g})",
                )

    def compute(self) -> None:
        """Each supported_if compare's better arm costs (measured parameters and FLOPs, as gate 1 measures
        them) at most MAX_COMPARED_COST_RATIO and the declared `max_ratio` times the arm it beats. A
        blind arm is exempt (beating it is refused by `blind_comparators`)."""
        bound = min(MAX_COMPARED_COST_RATIO, self.c.preflight.compute_cost.max_ratio)
        for i, c in enumerate(self.c.decision.supported_if):
            if not isinstance(c, Compare) or c.other == c.arm:
                continue
            for loser in failing_arms(c, self.spec):
                winner = c.arm if loser == c.other else c.other
                if loser in self.c.blind or not {winner, loser} <= set(self.configs):
                    continue
                for kind, ratio in self.cost_ratios(winner, loser):
                    if ratio > bound:
                        self.add(
                            ("decision", "supported_if", i),
                            f"asserts that {winner!r} beats {loser!r} at {ratio:.3g}x its {kind} (measured): "
                            f"a claim about compute as much as about design; expected a comparator of "
                            f"matched cost, within {bound:g}x (the smaller of {MAX_COMPARED_COST_RATIO:g} "
                            f"and gate 1's max_ratio)",
                        )

    def cost_ratios(self, arm: str, other: str) -> list[tuple[str, float]]:
        """(what, arm's / other's) for trainable parameters and forward FLOPs, where both are measured."""
        ratios = []
        for kind, measure in (("parameters", self.study.param_count), ("FLOPs", self.study.flops)):
            a, b = measure(self.configs[arm]), measure(self.configs[other])
            if a is not None and b:
                ratios.append((kind, a / b))
        return ratios

    def ceilings(self) -> None:
        """A ceiling's references exist, and no bar lies beyond a ceiling known before the run."""
        for base, c in self.located:
            ref = getattr(c, "ceiling", None)
            if ref is not None and isinstance(c, Trend):
                self.add(
                    base + ("ceiling",), "a ceiling applies to a threshold or compare, not a trend"
                )
                continue
            if ref is not None and ref.arm is not None and ref.arm not in self.c.arms:
                self.add(
                    base + ("ceiling", "arm"),
                    f"no arm named {ref.arm!r}; arms: {', '.join(self.c.arms)}",
                )
            if ref is not None and ref.metric is not None and ref.metric not in self.study.metrics:
                self.add(
                    base + ("ceiling", "metric"),
                    f"study {self.study.name!r} reports no metric {ref.metric!r}",
                )
            if isinstance(c, Trend) or not self.better(c):
                continue
            value, why = None, ""
            if ref is not None and ref.value is not None:
                value, why = ref.value, ref.why
            elif ref is None and self.configs.get(c.arm) is not None:
                known = self.study.ceiling(c.metric, self.configs[c.arm])
                if known is not None and known.value is not None:
                    value, why = known.value, known.why
            if value is None or not isinstance(c, Threshold):
                continue
            if (c.value >= value) if c.direction == "higher" else (c.value <= value):
                self.add(
                    base + ("value",),
                    f"the bar {c.value:g} is not below what the best possible arm reaches "
                    f"({value:g}: {why}): the condition tests nothing; expected a bar the "
                    f"ceiling clears",
                )

    def comparisons(self) -> None:
        """The arms the decision and the controls read (a claim compares them, through compares, trends or
        thresholds set side by side) differ only in the declared factor under test, or in differences
        declared with why; the fields named exist. One line per undeclared field, naming the arms."""
        fields = set(self.study.Config.model_fields)
        for key in list(self.c.factor or []) + list(self.c.differences):
            if key not in fields:
                where = ("factor",) if key in (self.c.factor or []) else ("differences", key)
                self.add(where, f"{key!r} is not a field of study {self.study.name!r}'s arm config")
        allowed = set(self.c.factor or []) | set(self.c.differences)
        if self.c.tuning is not None:
            allowed |= set(self.c.tuning.space)  # tuned alike, within one pre-registered search
        arms = [
            a
            for a in dict.fromkeys(a for _, c in self.located for a, _ in condition_terms(c))
            if a in self.configs
        ]
        undeclared: dict[
            str, list[tuple[str, object]]
        ] = {}  # field -> (arm, value) of each arm that differs
        for arm in arms[1:]:
            for key, (first, value) in config_differences(
                self.configs[arms[0]], self.configs[arm]
            ).items():
                if key not in allowed and key != "device":  # where an arm runs, not what it is
                    undeclared.setdefault(key, [(arms[0], first)]).append((arm, value))
        for key, values in undeclared.items():
            shown = ", ".join(f"{arm} {value!r}" for arm, value in values[:4]) + (
                " ..." if len(values) > 4 else ""
            )
            field = ("factor",) if self.c.factor is None else ("differences",)
            self.add(
                field,
                f"the arms the decision compares differ in {key!r} ({shown}), which the contract does not "
                f"declare; expected `factor: [...]` naming the config fields under test and `differences: "
                f"{{{key}: why}}` for any other (a comparator handicapped by a setting nobody declared "
                f"cannot pass as evidence)",
                # said where the field is written, else at the value of an arm that differs in it
                at=None if field[0] in self.c.model_fields_set else ("arms", values[1][0], key),
            )

    def identical_arms(self) -> None:
        """Two arms with the same config are one experiment run twice."""
        seen: dict[str, str] = {}
        for arm, config in self.configs.items():
            key = config.model_dump_json()
            if key in seen:
                self.add(
                    ("arms", arm),
                    f"arm {arm!r} has the same config as arm {seen[key]!r}: they are one "
                    f"experiment run twice; expected arms that differ in the factor under test",
                )
            seen.setdefault(key, arm)

    def prediction(self) -> None:
        """No supported_if condition contradicts the direction of the contract's own predicted ablation."""
        pa = self.c.preflight.predicted_ablation
        for i, c in enumerate(self.c.decision.supported_if):
            if (
                not isinstance(c, Compare)
                or (c.other_metric or c.metric) != c.metric
                or c.metric != pa.metric
                or (c.margin or 0) < 0
            ):  # a non-inferiority bound asserts no direction
                continue
            if (c.arm, c.other) == (pa.arm, pa.versus):
                said = c.direction
            elif (c.arm, c.other) == (pa.versus, pa.arm):
                said = "higher" if c.direction == "lower" else "lower"
            else:
                continue
            if said != pa.direction:
                self.add(
                    ("decision", "supported_if", i, "direction"),
                    f"says {pa.arm} is {said} than {pa.versus} on {pa.metric}, but the contract's predicted "
                    f"ablation (gate 3) says {pa.direction}; expected a condition in the predicted direction",
                )

    def falsifiable_point(self) -> None:
        """A supported_if threshold on the falsifiable point's (arm, metric) (gate 5) goes its direction,
        with a bar at least as strict as its threshold: a looser bar lets a result the contract says
        would refute the claim support it."""
        fp = self.c.preflight.falsifiable_point
        point = f"{fp.arm}.{fp.metric} {_SIGN[fp.direction]} {fp.threshold:g}"
        for i, c in enumerate(self.c.decision.supported_if):
            if not isinstance(c, Threshold) or (c.arm, c.metric) != (fp.arm, fp.metric):
                continue
            if c.direction != fp.direction:
                self.add(
                    ("decision", "supported_if", i, "direction"),
                    f"says {c.arm}.{c.metric} {_SIGN[c.direction]} {c.value:g}, but the falsifiable point "
                    f"(gate 5) passes only where {point}: the condition contradicts the claim's own words; "
                    f"expected direction {fp.direction!r}",
                )
            elif _beyond(fp.threshold, c.value, fp.direction):
                self.add(
                    ("decision", "supported_if", i, "value"),
                    f"the bar {c.value:g} is looser than the falsifiable point (gate 5: {point}): a result "
                    f"the contract says would refute the claim would support it; expected a bar at least "
                    f"as strict as {fp.threshold:g}",
                )

    def refutation(self) -> None:
        """Each refuted_if condition mirrors a supported_if one (reads one of its (arm, metric) terms) or
        says what else it refutes (`refutes`); only a refuted_if condition says so."""
        asserted = {t for c in self.c.decision.supported_if for t in condition_terms(c)}
        for i, c in enumerate(self.c.decision.refuted_if):
            terms = condition_terms(c)
            if c.refutes is None and not asserted & set(terms):
                self.add(
                    ("decision", "refuted_if", i),
                    f"reads {', '.join(f'{a}.{m}' for a, m in terms)}, which no supported_if condition reads: "
                    f"it refutes something the claim does not assert; expected a condition mirroring a "
                    f"supported_if one, or `refutes: what it refutes`",
                )
        for base, c in self.located:
            if c.refutes is not None and base[:2] != ("decision", "refuted_if"):
                self.add(
                    base + ("refutes",),
                    "`refutes` says what a refuted_if condition refutes; expected it only on a refuted_if "
                    "condition",
                )

    def futility(self) -> None:
        """Futility rules halt only arms under test: a halt is evidence against the arm it halts."""
        comparators = self.c.arms_named_by_decision() - arms_under_test(self.c.decision)
        for i, rule in enumerate(self.c.stop_rules.futility):
            halted = sorted(comparators & set(rule.arms or self.c.arms))
            if halted:
                self.add(
                    ("stop_rules", "futility", i, "arms" if rule.arms else "metric"),
                    f"the futility rule can halt comparator arm(s) {halted}: a halt is evidence against the arm "
                    f"it halts, not against the hypothesis; expected `arms` listing only arms under test "
                    f"({', '.join(sorted(arms_under_test(self.c.decision)))})",
                )

    def seeds(self) -> None:
        """Seeds are a count the platform expands (from a declared start): never a hand-picked list."""
        if not is_contiguous(list(self.c.seeds)):
            self.add(
                ("seeds",),
                f"seeds {list(self.c.seeds)} are not contiguous: a hand-picked list can be chosen "
                f"after a private run; expected seeds: N (seeds 0..N-1) or {{count: N, start: S}}",
            )

    def reported(self) -> None:
        """Every (arm, metric) a condition, control or ceiling reads is one the arm reports."""
        for base, c in self.located:
            reads = list(condition_terms(c))
            ref = getattr(c, "ceiling", None)
            if ref is not None and ref.metric is not None and not isinstance(c, Trend):
                reads.append((c.arm, ref.metric))
            for arm, metric in reads:
                config = self.configs.get(arm)
                if config is None or metric not in self.study.metrics:
                    continue
                if metric not in self.study.reported_metrics(config):
                    self.add(
                        base,
                        f"reads {arm}.{metric}, which study {self.study.name!r} does not report for that "
                        f"arm's config: a condition on it can never be measured; expected a metric the "
                        f"arm reports",
                    )

    def tuning(self) -> None:
        """Tuning searches only the hyperparameters a study declares (never what an arm is)."""
        if self.c.tuning is None:
            return
        declared = sorted(self.study.hyperparameters)
        for key in self.c.tuning.space:
            if key in self.study.Config.model_fields and key not in self.study.hyperparameters:
                self.add(
                    ("tuning", "space", key),
                    f"{key!r} is not a hyperparameter of study {self.study.name!r} "
                    f"(declared: {', '.join(declared) or 'none'}); tuning searches "
                    f"only settings the study declares tunable",
                )

    def convergence(self) -> None:
        """A contract whose study trains judges convergence, or says why its runs cannot be judged so."""
        if self.study.trains and self.c.convergence is None and self.c.no_convergence is None:
            self.add(
                ("convergence",),
                f"study {self.study.name!r} trains its arms but the contract has no "
                f"convergence rule; expected `convergence: {{metric, window, "
                f"max_rel_improvement}}` (or `no_convergence: why`), so no verdict rests on "
                f"arms stopped while still learning",
            )

    def reachable(self) -> None:
        """The conditions can reach significance with the seeds."""
        if self.c.decision.evaluation != "interval":
            return
        from gates.inference import unreachable

        for list_name, i, why in unreachable(
            self.c.decision, len(self.c.seeds), self.study.metrics
        ):
            self.add(("decision", list_name, i, "interval"), why)


# ---------------------------------------------------------------------------------- helpers
def failing_arms(c, spec) -> list[str]:
    """The arms a threshold or compare asserts fail: a threshold in its metric's worse direction, the
    worse side of a compare (not a non-inferiority bound; trends compare arms that each must work, and
    assert no failure)."""
    if isinstance(c, Threshold):
        metric = spec(c.metric)
        return [c.arm] if metric is not None and c.direction != metric.direction else []
    if isinstance(c, Compare) and c.other != c.arm:
        metric = spec(c.metric)
        if (
            metric is None or (c.margin or 0) < 0
        ):  # a non-inferiority bound asserts that no arm fails
            return []
        return [c.other] if c.direction == metric.direction else [c.arm]
    return []


_SIGN = {"higher": ">=", "lower": "<="}  # what a threshold in each direction asserts


def _beyond(a: float, b: float, direction: str) -> bool:
    """Whether `a` lies strictly beyond `b` in `direction` (higher: a > b; lower: a < b)."""
    return a > b if direction == "higher" else a < b


def config_differences(a, b) -> dict[str, tuple]:
    """field -> (a's value, b's value) for every arm config field in which two arms differ."""
    x, y = a.model_dump(mode="json"), b.model_dump(mode="json")
    return {
        k: (x.get(k), y.get(k)) for k in dict.fromkeys(list(x) + list(y)) if x.get(k) != y.get(k)
    }


def _diff_span(low_a, high_a, low_b, high_b):
    """The range of a - b given the ranges of a and b (None: unbounded on that side)."""
    lo = None if low_a is None or high_b is None else low_a - high_b
    hi = None if high_a is None or low_b is None else high_a - low_b
    return lo, hi
