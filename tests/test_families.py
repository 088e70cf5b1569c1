"""A claim's versions are one family (issue #38 part 1): a version is judged at the alpha the versions
before it left, on seeds none of them used, and the family is shown and verified with the claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gates.contract import load_contract
from gates.record import Family, Version, family_of
from tests.conftest import small_c05, write_contract
from tests.helpers import gates, run_contract


def first_version(**decision) -> dict:
    data = small_c05(id="fam")
    data["seeds"] = 3
    data["decision"].update(decision)
    return data


def next_version(previous: str, seeds, **decision) -> dict:
    data = first_version(**decision)
    data.update(id=f"{previous}-v2", supersedes=previous, seeds=seeds)
    data["decision"].pop("family_alpha", None)
    return data


@pytest.fixture(scope="module")
def recorded(make_project):
    """Two first versions run into a temp project: `fam` at full alpha (its family has none left) and
    `keep` at alpha 0.025 of a family alpha of 0.05 (a re-try may spend the other 0.025)."""
    keep = first_version(alpha=0.025, family_alpha=0.05)
    keep["id"] = "keep"
    return make_project(first_version(), keep, name="families")


def test_the_versions_spend_one_alpha_in_order():
    """Each recorded version spends its own alpha up to what the versions before it left; a version
    never recorded spends nothing; the next seeds follow every earlier version's, tuning seeds too."""
    family = Family("a", 0.05)
    family = Family("a", 0.05, (Version("a", family.level(0.02), (0, 1, 2), True),))
    assert family.left == pytest.approx(0.03) and family.level(0.05) == pytest.approx(0.03)
    family = Family("a", 0.05, (*family.earlier, Version("a-v2", 0.0, (3, 4, 100), False)))
    assert family.left == pytest.approx(0.03) and family.next_seed == 101
    spent = Family("a", 0.05, (Version("a", 0.05, (0, 1), True),))
    assert spent.level(0.05) == 0 and spent.left == 0
    # the attempts of one version: each spends what it was judged at, but an invalid one decided nothing
    fresh = Family("a", 0.05)
    assert fresh.after_attempts(["inconclusive"]).level(0.05) == 0
    assert fresh.after_attempts(["invalid"]).level(0.05) == 0.05
    twice = fresh.after_attempts(["invalid", "refuted"])
    assert twice.left_by_attempts(0.02) == pytest.approx(0.03) and twice.level(0.02) == 0.02
    assert fresh.after_attempts(["invalid"]).attempt == 2


def test_a_retry_at_full_alpha_on_the_same_seeds_is_refused(project):
    """The re-try the issue found four times on the record: a new version on the same seeds at full
    alpha after the first spent it all. `gates check` names the spent family and the next seeds."""
    write_contract(project / "contracts", next_version("fam", [0, 1, 2, 3, 4]), "fam-v2.yaml")
    result = gates(project, "check", "contracts/fam-v2.yaml")
    assert result.returncode == 2, result.stdout + result.stderr
    said = " ".join((result.stdout + result.stderr).split())
    assert "decision.alpha" in said and "no alpha left" in said and "(fam)" in said
    assert "seeds 0-4 are not the family's next 5" in said
    assert "expected seeds: {count: 5, start: 3}" in said


def test_a_first_version_starts_at_seed_0(project):
    data = first_version()
    data.update(id="shopped", seeds={"count": 3, "start": 17})
    write_contract(project / "contracts", data, "shopped.yaml")
    result = gates(project, "check", "contracts/shopped.yaml")
    assert result.returncode == 2
    said = " ".join((result.stdout + result.stderr).split())
    assert "a first version's seeds start at 0" in said and "expected seeds: 3" in said


def test_family_alpha_is_declared_on_the_first_version_only(project):
    data = next_version("keep", {"count": 3, "start": 3}, alpha=0.025, family_alpha=0.05)
    data["decision"]["family_alpha"] = 0.05
    write_contract(project / "contracts", data, "keep-v2.yaml")
    result = gates(project, "check", "contracts/keep-v2.yaml")
    assert result.returncode == 2
    assert "decision.family_alpha" in result.stdout + result.stderr


def test_a_retry_spends_what_its_family_kept(project):
    """`keep` kept 0.025 of its family's 0.05: a version asking for more is refused; one at 0.025 on the
    next seeds runs, is judged at 0.025, records its family, and verify re-derives it; a second
    successor of the same version (a branch that would spend the same alpha again) is refused."""
    too_much = next_version("keep", {"count": 3, "start": 3}, alpha=0.05)
    write_contract(project / "contracts", too_much, "keep-v2.yaml")
    result = gates(project, "check", "contracts/keep-v2.yaml")
    assert result.returncode == 2
    said = " ".join((result.stdout + result.stderr).split())
    assert "expected decision.alpha <= 0.025" in said
    write_contract(
        project / "contracts",
        next_version("keep", {"count": 3, "start": 3}, alpha=0.025),
        "keep-v2.yaml",
    )
    assert gates(project, "check", "contracts/keep-v2.yaml").returncode == 0
    uri = f"sqlite:///{project / 'mlflow.db'}"
    result = gates(project, "run", "contracts/keep-v2.yaml", "--tracking-uri", uri)
    assert result.returncode == 0, result.stdout + result.stderr
    ev = json.loads((project / "runs" / "keep-v2" / "evidence.json").read_text())
    assert ev["family"] == {
        "root": "keep",
        "alpha": 0.05,
        "earlier": [{"contract_id": "keep", "level": 0.025}],
        "level": 0.025,
    }
    assert ev["reasons"][0].startswith("version 2 of claim family keep")
    report = (project / "runs" / "keep-v2" / "verdict.md").read_text()
    assert "version 2 of claim family keep" in report and "|family:keep@0.025|" in report
    assert "family keep" in gates(project, "status", "-v").stdout
    verified = gates(project, "verify")
    assert verified.returncode == 0, verified.stdout
    branch = next_version("keep", {"count": 3, "start": 6}, alpha=0.025)
    branch["id"] = "keep-v2b"
    write_contract(project / "contracts", branch, "keep-v2b.yaml")
    result = gates(project, "check", "contracts/keep-v2b.yaml")
    said = " ".join((result.stdout + result.stderr).split())
    assert "already superseded by recorded keep-v2" in said
    # nor another attempt of keep: keep-v2 was judged at the alpha keep left
    again = gates(project, "run", "contracts/keep.yaml", "--record", "--reason", "one more")
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert "keep is superseded by recorded keep-v2" in " ".join(again.stderr.split())


def test_a_second_attempt_spends_what_the_first_left(project):
    """`gates run --record --reason` records the same contract again (after a change of code, say): a
    re-try too. `keep` (alpha 0.025 of 0.05): attempt 2 is judged at the 0.025 attempt 1 left, attempt 3
    at alpha 0; verify re-derives both, and a next version finds its family spent."""
    uri = f"sqlite:///{project / 'mlflow.db'}"
    evidence = project / "runs" / "keep" / "evidence.json"
    for attempt, level in ((2, 0.025), (3, 0)):
        result = gates(
            project,
            "run",
            "contracts/keep.yaml",
            "--tracking-uri",
            uri,
            "--record",
            "--reason",
            "again",
        )
        assert result.returncode == 0, result.stdout + result.stderr
        ev = json.loads(evidence.read_text())
        assert ev["attempt"]["number"] == attempt
        assert (ev["family"]["level"], ev["family"]["attempt"]) == (level, attempt)
        assert f"attempt {attempt} (its attempts before spent" in ev["reasons"][0]
    assert ev["verdict"] == "inconclusive" and any("no alpha left" in r for r in ev["reasons"])
    verified = gates(project, "verify")
    assert verified.returncode == 0, verified.stdout
    write_contract(
        project / "contracts",
        next_version("keep", {"count": 3, "start": 3}, alpha=0.025),
        "keep-v2.yaml",
    )
    said = " ".join(gates(project, "check", "contracts/keep-v2.yaml").stderr.split())
    assert "its claim family (keep) has no alpha left" in said
    later = load_contract(project / "contracts" / "keep-v2.yaml").contract
    family = family_of(later, project / "runs", project / "contracts")
    assert family.earlier == (Version("keep", 0.05, (0, 1, 2), True, 3),) and family.left == 0


def test_a_version_with_no_alpha_left_cannot_decide(project, monkeypatch):
    """Run past the check (the Python API), a re-try whose family spent its alpha is judged at alpha 0:
    inconclusive, whatever its data, saying why and that no more seeds can settle it; verify agrees,
    and names a family the record no longer gives (the first version's alpha edited after the fact)."""
    write_contract(
        project / "contracts", next_version("fam", {"count": 3, "start": 3}), "fam-v2.yaml"
    )
    monkeypatch.chdir(project)
    evidence = run_contract(
        load_contract("contracts/fam-v2.yaml"),
        f"sqlite:///{project / 'mlflow.db'}",
        project / "runs",
    )
    assert evidence.verdict == "inconclusive"
    assert evidence.family.level == 0 and evidence.family.root == "fam"
    assert any("no alpha left" in r for r in evidence.reasons)
    assert evidence.settle and "alpha is spent" in evidence.settle[0]
    assert all(c.outcome == "undetermined" for c in evidence.conditions)
    assert gates(project, "verify").returncode == 0
    first = yaml.safe_load((project / "contracts" / "fam.yaml").read_text())
    first["decision"]["family_alpha"] = 0.1
    write_contract(project / "contracts", first, "fam.yaml")
    rows = {r["id"]: r for r in json.loads(gates(project, "status", "--json", "--full").stdout)}
    assert "family" in rows["fam-v2"]["problem_codes"], rows["fam-v2"]


def test_family_of_reads_the_record(recorded):
    first = load_contract(recorded / "contracts" / "fam.yaml").contract
    assert family_of(first, recorded / "runs", recorded / "contracts") == Family("fam", 0.05)


def test_an_inconclusive_verdict_says_what_its_family_leaves_a_retry(recorded):
    """More seeds are never suggested as if a re-try were a fresh test: the last line says what a new
    version would be (the family's next seeds, the alpha left) or that none is left."""
    from gates.entities import Verdict
    from gates.inference import ENGINE_VERSION
    from gates.inference._judging import _family_notes

    for name, want in (
        ("fam", "more seeds cannot settle it as this claim"),
        (
            "keep",
            "`seeds: {count: N, start: 3}` (the family's next) and `decision.alpha` at most 0.025",
        ),
    ):
        contract = load_contract(recorded / "contracts" / f"{name}.yaml").contract
        verdict = Verdict(
            "inconclusive",
            ["r"],
            [],
            contract.decision.alpha,
            "interval",
            "iut+holm",
            engine_version=ENGINE_VERSION,
        )
        verdict.settle = ["supported_if[0] ...: about 9 seeds per arm for 80% power"]
        _family_notes(verdict, family_of(contract, recorded / "runs"), contract)
        assert len(verdict.settle) == 2 and want in verdict.settle[-1], verdict.settle


def test_a_false_claim_retried_version_after_version_keeps_the_family_level():
    """The level the family rule promises, simulated through the engine (benchmarks/version_chains.py):
    a false claim re-tried 3 -> 5 -> 8 -> 10 seeds whenever inconclusive ends supported at most alpha
    (within 3 Monte Carlo standard errors) when the versions share the family's alpha, and far more
    often when each version is tested at full alpha on fresh seeds (the rule this replaces)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "version_chains.py"
    spec = importlib.util.spec_from_file_location("version_chains_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    draws = 1000
    bound = 0.05 + 3 * (0.05 * 0.95 / draws) ** 0.5
    shared = bench.simulate([3, 5, 8, 10], "family-split", draws)
    assert shared["false_support"] <= bound and shared["false_refutation"] <= bound, shared
    assert bench.simulate([3, 5, 8, 10], "full-fresh", draws)["false_support"] > bound
