"""Review plots for a contract's parent MLflow run (matplotlib, PNG, no display needed).

- learning curves: per metric the decision, the falsifiable point, a futility rule or the convergence
  rule names, one line per arm x seed, with the decision's thresholds, the falsifiable point's bar up
  to its step, the futility bars, the halt points, the convergence window and the runs still
  improving at its end marked; the title's legend names only the marks drawn;
- condition intervals: every condition's effect with its interval against zero (its margin).
"""

from __future__ import annotations

from pathlib import Path

from gates.contract import Contract, Threshold, condition_terms
from gates.entities import ConditionRecord, RunRecord


def plotted_metrics(contract: Contract) -> list[str]:
    """The metrics a reviewer needs to see move: those the decision, gate 5 or a stop rule name."""
    names = [contract.preflight.falsifiable_point.metric]
    for _, _, c in contract.conditions():
        names += [metric for _, metric in condition_terms(c)]
    names += [rule.metric for rule in contract.stop_rules.futility]
    if contract.convergence is not None:
        names.append(contract.convergence.metric)
    return list(dict.fromkeys(names))


def learning_curves(
    contract: Contract,
    histories: dict[tuple[str, int], dict[str, list[tuple[int, float]]]],
    records: list[RunRecord],
    path: Path,
) -> Path:
    """The learning curves of `records` (the runs as evidence.json lists them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = plotted_metrics(contract)
    arms = list(contract.arms)
    colours = {arm: plt.get_cmap("tab10")(i % 10) for i, arm in enumerate(arms)}
    gate5 = contract.preflight.falsifiable_point
    drawn: dict[str, str] = {}  # mark -> its legend entry: the title names only what is drawn
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 3.2 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics):
        for (arm, seed), series in histories.items():
            points = series.get(metric, [])
            if points:
                steps, values = zip(*points)
                ax.plot(
                    steps,
                    values,
                    color=colours[arm],
                    alpha=0.8,
                    lw=1.2,
                    label=arm if seed == contract.seeds[0] else None,
                )
        for _, _, c in contract.conditions():
            if isinstance(c, Threshold) and c.metric == metric:
                ax.axhline(c.value, color=colours[c.arm], ls="--", lw=0.8)
                drawn["thr"] = "dashed: decision thresholds"
        if gate5.metric == metric:  # the falsifiable point: the arm's bar up to its step
            ax.plot([0, gate5.by_step], [gate5.threshold] * 2, color=colours[gate5.arm], ls="-.")
            ax.plot(gate5.by_step, gate5.threshold, marker="D", color=colours[gate5.arm])
            drawn["gate5"] = "dash-dot to a diamond: gate 5"
        for rule in contract.stop_rules.futility:
            if rule.metric == metric:
                ax.axvline(rule.at_step, color="grey", ls=":", lw=0.8)
                if rule.worse_than is not None:
                    ax.axhline(rule.worse_than, color="grey", ls=":", lw=0.8)
                drawn["fut"] = "dotted: futility"
        for r in records:
            if r.status == "halted" and (r.arm, r.seed) in histories:
                points = histories[(r.arm, r.seed)].get(metric, [])
                if points:
                    ax.plot(*points[-1], marker="x", ms=9, color="red")
                    drawn["halt"] = "x: halt"
        conv = contract.convergence
        if conv is not None and conv.metric == metric:
            end = contract.budget.steps
            ax.axvspan(
                end - conv.window,
                end,
                color="gold",
                alpha=0.15,
                lw=0,
                label=f"convergence window ({conv.window} steps)",
            )
            drawn["conv"] = "shaded: convergence window"
            for r in (
                records
            ):  # a completed run still improving at its end: an open circle on its last point
                points = histories.get((r.arm, r.seed), {}).get(metric, [])
                if r.converged is False and points:
                    ax.plot(*points[-1], marker="o", ms=9, mfc="none", color="darkorange")
                    drawn["still"] = "o: not converged"
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        axes[0, 0].legend(fontsize=8, loc="best")
    legend = f" ({'; '.join(drawn.values())})" if drawn else ""
    fig.suptitle(f"{contract.id}: learning curves{legend}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def condition_intervals(contract_id: str, conditions: list[ConditionRecord], path: Path) -> Path:
    """Each condition's estimate and interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colour = {"holds": "tab:green", "fails": "tab:red", "undetermined": "tab:orange"}
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(conditions) + 1.5))
    for row, c in enumerate(conditions):
        if c.estimate is None:
            continue
        low = c.ci_low if c.ci_low is not None else c.estimate
        high = c.ci_high if c.ci_high is not None else c.estimate
        ax.errorbar(
            c.estimate,
            row,
            xerr=[[c.estimate - low], [high - c.estimate]],
            fmt="o",
            color=colour[c.outcome],
            capsize=4,
        )
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(conditions)))
    ax.set_yticklabels([f"{c.label} {c.description}"[:70] for c in conditions], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("effect beyond the margin (> 0: the condition holds); interval at 1 - 2 alpha")
    ax.set_title(
        f"{contract_id}: conditions\n(green holds, red fails, orange undetermined)", fontsize=10
    )
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
