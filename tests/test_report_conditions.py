"""verdict.md reads its conditions as the dashboard does (issue #27): a supported_if condition and its
refuted_if mirror share one row, and every row says what its result means for the claim, so that a
refuted_if condition that fails reads "rules it out" rather than asking for a mental inversion."""

from __future__ import annotations

from gates.record import as_evidence, render_report
from tests.conftest import frozen_evidence


def conditions_table(contract_id: str) -> list[str]:
    text = render_report(as_evidence(frozen_evidence(contract_id)))
    section = text.split("## Conditions", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "`" in line]


def test_a_condition_and_its_mirror_are_one_row_saying_what_it_means():
    table = conditions_table("c05-structural-probe")  # 4 thresholds, each with its mirror
    assert len(table) == 4
    first = table[0]
    assert first.startswith(
        "| supported_if[0]: `subheap_kernel.test_acc >= 0.95`, mirror refuted_if[0] | "
    )
    result = first.split(" | ")[1]
    assert (
        result.startswith("**") and "(supported_if[0] " in result and ", refuted_if[0] " in result
    )
    meaning = result.split("**")[1]
    assert meaning in ("supports", "refutes", "undetermined")


def test_conditions_without_a_mirror_keep_their_own_rows_with_their_meaning():
    # c05-baseline-control's refuted_if has another bar (+ 0.1 against + 0.5): no mirror
    table = conditions_table("c05-baseline-control")
    assert [row.split(":")[0] for row in table] == ["| supported_if[0]", "| refuted_if[0]"]
    meanings = {
        "**holds**: supports the claim",
        "**fails**: refutes it",
        "**holds**: refutes the claim",
        "**fails**: rules it out",
        "**undetermined**",
    }
    assert all(row.split(" | ")[1] in meanings for row in table)
