"""The design rules on the claim and its plan: conditions follow the predicted direction and the
falsifiable point, refutations mirror what they refute, futility halts only arms under test, seeds are
a count, conditions read metrics the arm reports, tuning searches declared hyperparameters, a
training study judges convergence, and the seeds can reach significance.
"""

from __future__ import annotations

from gates.contract import (
    Compare,
    Threshold,
    Trend,
    arms_under_test,
    condition_terms,
    is_contiguous,
)
from gates.design._rule_base import _SIGN, _beyond, _RuleBase


class _ClaimRules(_RuleBase):
    """Rules `prediction` to `reachable` (RULES' order)."""

    def prediction(self) -> None:
        """No supported_if condition contradicts the direction of the contract's own predicted ablation."""
        pa = self.c.preflight.predicted_ablation
        for i, c in enumerate(self.c.decision.supported_if):
            if (
                not isinstance(c, Compare)
                or (c.other_metric or c.metric) != c.metric
                or c.metric != pa.metric
                or c.non_inferiority
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
