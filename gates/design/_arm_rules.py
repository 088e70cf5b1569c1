"""The design rules on what a contract asserts of its arms: positive and negative controls, negative
results that need a working arm, no comparator blind by construction, non-inferiority margins, compute
matched between compared arms, bars within a known ceiling, compared arms that differ only in the
declared factor, no two arms with one config.
"""

from __future__ import annotations

from gates.contract import Compare, Threshold, Trend, condition_terms
from gates.design._rule_base import _SIGN, _beyond, _RuleBase, config_differences, failing_arms

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


class _ArmRules(_RuleBase):
    """Rules `controls` to `identical_arms` (RULES' order)."""

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
            elif isinstance(c, Compare) and c.non_inferiority:
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
        """A supported_if non-inferiority margin (a compare's negative `margin`, or negative
        `relative_margin` on a log-scale metric) is at most the smallest effect of interest the decision
        declares for its metric (`smallest_effects`: absolute, or a share on a log-scale metric, whose
        conditions are ratios), itself at most the predicted effect on that metric (an absolute
        difference: compared on linear metrics); on a metric with a declared range on both sides, the
        margin is also at most NON_INFERIORITY_SHARE of that range."""
        d, predicted = self.c.decision, self.c.preflight.predicted_ablation
        for metric in d.smallest_effects:
            spec = self.spec(metric)
            if spec is None:
                self.add(
                    ("decision", "smallest_effects", metric),
                    f"{metric!r} is not a metric of study {self.study.name!r}",
                )
            elif (
                metric == predicted.metric
                and spec.scale != "log"
                and d.smallest_effects[metric] > predicted.size
            ):
                self.add(
                    ("decision", "smallest_effects", metric),
                    f"the smallest effect of interest {d.smallest_effects[metric]:g} exceeds the predicted "
                    f"effect {predicted.size:g} on {metric} (gate 3): the prediction itself would not "
                    f"matter; expected at most {predicted.size:g}",
                )
        for i, c in enumerate(d.supported_if):
            if not isinstance(c, Compare) or not c.non_inferiority:
                continue
            spec = self.spec(c.metric)
            relative = c.relative_margin is not None
            if relative and getattr(spec, "scale", "") != "log":
                self.add(
                    ("decision", "supported_if", i, "relative_margin"),
                    f"a relative non-inferiority margin on {c.metric!r}, which study {self.study.name!r} "
                    f"does not declare log-scale: its smallest effect of interest is absolute; expected "
                    f"an absolute negative `margin`",
                )
                continue
            width = -(c.relative_margin if relative else c.margin)
            field, unit = ("relative_margin", " (a share)") if relative else ("margin", "")
            smallest = d.smallest_effects.get(c.metric)
            if smallest is None or width > smallest:
                self.add(
                    ("decision", "supported_if", i, field),
                    f"the non-inferiority margin {width:g}{unit} on {c.metric} "
                    + (
                        "has no declared smallest effect of interest"
                        if smallest is None
                        else f"exceeds the declared smallest effect of interest {smallest:g}"
                    )
                    + f": 'no worse by more than {width:g}' must mean 'no worse by any difference that "
                    f"matters'; expected `decision.smallest_effects: {{{c.metric}: S}}` fixed before the "
                    f"run, with the margin at most S",
                )
            if relative or spec is None or spec.low is None or spec.high is None:
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
