"""A study from another package: examples/my_study registered as an installed distribution registers it
(a dist-info folder with its entry_points.txt on sys.path, never an import path in a contract), then
`gates studies`, `schema`, `check` and `run` on its example contract end to end in a temp project.
Studies that break the interface fail by name, and a run that breaks it is recorded as failed without
losing anything else. `gates run --fetch` fetches a missing corpus (apt faked, no network)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib
from mlflow import MlflowClient

from tests.helpers import gates

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "my_study"
CONTRACT = EXAMPLE / "contracts" / "circle-quadratic.yaml"

# studies that break the interface, and one that reads a corpus, in a second package of the test's own
FAULTY = '''
from typing import Literal

from gates.study import Study
from my_study.study import MyConfig, MyStudy


class FaultyConfig(MyConfig):
    fault: Literal["none", "raise", "undeclared"] = "none"


class FaultyStudy(MyStudy):
    """The example study, with faults on some arm x seeds."""

    name = "faulty"
    Config = FaultyConfig

    def run(self, config, seed, reporter):
        final = super().run(config, seed, reporter)
        if config.fault == "raise" and seed == 1:
            raise RuntimeError("simulated crash in seed 1")
        if config.fault == "undeclared" and seed == 2:
            return {**final, "accuracy": final["test_acc"]}
        return final


class NoMetrics(Study):
    """Forgets to declare its metrics."""

    name = "no_metrics"
    Config = MyConfig

    def param_count(self, config):
        return 1

    def run(self, config, seed, reporter):
        return {}


class CorpusConfig(MyConfig):
    corpus: str = "libreoffice-help:en"


class CorpusStudy(MyStudy):
    """The example study, which also needs a registered corpus."""

    name = "corpus_circle"
    Config = CorpusConfig

    def check_ready(self, config):
        from gates.models.corpora import check_source

        return check_source(config.corpus, kind="text")

    def run(self, config, seed, reporter):
        from gates.models.corpora import load_text

        assert load_text(config.corpus)
        return super().run(config, seed, reporter)
'''

# the CLI with apt replaced by the synthetic LibreOffice help tree of tests/test_data.py
FAKE_APT = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from gates.models import corpora as data
from tests.test_data import write_help_tree


def download_and_extract(packages, work_dir, say):
    say("downloading (apt faked by the test)")
    write_help_tree(work_dir / "root")
    return {{package: "1:7.4-test" for package in packages}}


data._download_and_extract = download_and_extract
from gates.cli import main
main()
"""


def install_dist(site: Path, name: str, version: str, entry_points: dict[str, str]) -> None:
    """What installing a distribution leaves for importlib.metadata: NAME-VERSION.dist-info with METADATA
    and entry_points.txt."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[gates.studies]\n{lines}")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A site folder where examples/my_study is installed (its entry points read from its own
    pyproject.toml) and a faulty package beside it."""
    site = tmp_path_factory.mktemp("site")
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    install_dist(
        site, project["name"], project["version"], project["entry-points"]["gates.studies"]
    )
    shutil.copytree(EXAMPLE / "my_study", site / "my_study")
    (site / "faulty_study.py").write_text(FAULTY)
    install_dist(
        site,
        "gates-faulty",
        "0.1.0",
        {
            "faulty": "faulty_study:FaultyStudy",
            "no_metrics": "faulty_study:NoMetrics",
            "corpus_circle": "faulty_study:CorpusStudy",
        },
    )
    return site


def contract_text(contract_id: str, study: str, arms: str) -> str:
    """The example contract as another id, study and arms (its factor, blind arm and the rest kept)."""
    text = CONTRACT.read_text().replace("id: circle-quadratic", f"id: {contract_id}")
    text = text.replace("study: my_study", f"study: {study}")
    start, end = text.index("arms:\n"), text.index("factor:")
    return (
        text[:start]
        + "arms:\n"
        + textwrap.indent(textwrap.dedent(arms).strip() + "\n", "  ")
        + text[end:]
    )


@pytest.fixture(scope="module")
def project(site, make_project):
    """The example contract and a faulty one run into one temp MLflow store (about 30 s)."""
    root = make_project(CONTRACT, record=False)
    (root / "contracts" / "circle-faulty.yaml").write_text(
        contract_text(
            "circle-faulty",
            "faulty",
            """
        linear:    {features: linear}
        quadratic: {features: quadratic}
        crashing:  {features: quadratic, fault: raise}
        undeclared: {features: quadratic, fault: undeclared}
    """,
        )
    )
    uri = f"sqlite:///{root / 'mlflow.db'}"
    example = gates(
        root, "run", "contracts/circle-quadratic.yaml", "--tracking-uri", uri, site=site
    )
    assert example.returncode == 0, example.stderr
    recorded = (root / "runs" / "circle-quadratic" / "evidence.json").read_bytes()
    faulty = gates(root, "run", "contracts/circle-faulty.yaml", "--tracking-uri", uri, site=site)
    assert faulty.returncode == 0, faulty.stderr
    return {"root": root, "uri": uri, "example": example, "faulty": faulty, "recorded": recorded}


def evidence(root: Path, contract_id: str) -> dict:
    return json.loads((root / "runs" / contract_id / "evidence.json").read_text())


def test_the_example_study_is_found_listed_and_described(site, tmp_path):
    listed = gates(tmp_path, "studies", site=site)
    assert listed.returncode == 0, listed.stderr
    assert "my_study: my_study.study:MyStudy (gates-my-study 0.1.0)" in listed.stdout
    assert (
        "c05_probe: gates.models.c05_probe:C05ProbeStudy" in listed.stdout
    )  # beside this repository's studies
    detail = gates(tmp_path, "studies", "my_study", site=site)
    assert detail.returncode == 0, detail.stderr
    assert "train_loss: lower, train, range [0, inf]" in detail.stdout
    assert "test_acc: higher, test, range [0, 1]" in detail.stdout
    schema = gates(tmp_path, "schema", "--study", "my_study", site=site)
    assert schema.returncode == 0, schema.stderr
    fields = json.loads(schema.stdout)["properties"]
    assert fields["features"]["enum"] == ["linear", "quadratic"] and fields["lr"]["default"] == 1.0
    made = gates(tmp_path, "new", "circle-next", "--study", "my_study", site=site)
    assert made.returncode == 0, made.stderr
    assert 'features: "quadratic"' in (tmp_path / "contracts" / "circle-next.yaml").read_text()


def test_refresh_finds_a_distribution_installed_in_this_process(site, monkeypatch):
    """The registry caches what it found; `refresh` reads the installed metadata again (a `pip install`
    in a running process, or a test that adds a site folder)."""
    from gates.study import StudyError, get_study, refresh, study_names

    assert "my_study" not in study_names()
    monkeypatch.syspath_prepend(str(site))
    try:
        assert "my_study" not in study_names()  # cached
        refresh()
        assert "my_study" in study_names()
        assert get_study("my_study").param_count(get_study("my_study").Config()) == 6
        with pytest.raises(StudyError, match="study 'no_metrics' .* breaks the study interface"):
            get_study("no_metrics")
    finally:
        monkeypatch.undo()
        refresh()
    assert "my_study" not in study_names()


def test_the_example_study_is_under_100_lines():
    assert len((EXAMPLE / "my_study" / "study.py").read_text().splitlines()) < 100


def test_check_and_run_the_example_contract_end_to_end(site, project):
    root = project["root"]
    checked = gates(root, "check", "contracts/circle-quadratic.yaml", site=site)
    assert checked.returncode == 0, checked.stderr
    assert (
        "ready to run" in checked.stdout
        and "study: my_study; arms: linear, quadratic" in checked.stdout
    )
    assert "SUPPORTED  circle-quadratic" in project["example"].stdout
    ev = evidence(root, "circle-quadratic")
    assert ev["verdict"] == "supported" and ev["study"] == "my_study" and len(ev["runs"]) == 12
    assert all(r["status"] == "completed" for r in ev["runs"])
    assert {r["arm"]: r["metrics"]["test_acc"] > 0.85 for r in ev["runs"]} == {
        "linear": False,
        "quadratic": True,
    }
    client = MlflowClient(project["uri"])
    runs = client.search_runs([client.get_experiment_by_name("circle-quadratic").experiment_id])
    assert len(runs) == 13 and {r.info.status for r in runs} == {"FINISHED"}
    verified = gates(root, "verify", site=site)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert (
        "ok circle-quadratic: supported" in verified.stdout
        and "ok circle-faulty: supported" in verified.stdout
    )
    status = gates(root, "status", "--json", site=site)
    rows = {r["id"]: r for r in json.loads(status.stdout)}
    assert (
        rows["circle-quadratic"]["status"] == "ok" and rows["circle-quadratic"]["hash_ok"] is True
    )


def failed_run(project, arm: str, seed: int):
    ev = evidence(project["root"], "circle-faulty")
    record = next(r for r in ev["runs"] if (r["arm"], r["seed"]) == (arm, seed))
    others = [r for r in ev["runs"] if (r["arm"], r["seed"]) != (arm, seed)]
    run = MlflowClient(project["uri"]).get_run(record["mlflow_run_id"])
    return ev, record, others, run


def test_an_exception_in_run_fails_that_run_by_name_and_loses_nothing_else(project):
    ev, record, others, run = failed_run(project, "crashing", 1)
    assert record["status"] == "failed" and record["halt_reason"] == "error"
    # where it raised: the innermost frame, file:line as a reader finds it (relative to its import root)
    line = (
        FAULTY.splitlines().index('            raise RuntimeError("simulated crash in seed 1")') + 1
    )
    where = f"faulty_study.py:{line}"
    first = f"study 'faulty' raised RuntimeError at {where} in run(): simulated crash in seed 1"
    assert record["halt_detail"].splitlines()[0] == first and "Traceback" in record["halt_detail"]
    assert record["error"] == {
        "type": "RuntimeError",
        "message": "simulated crash in seed 1",
        "where": where,
    }
    assert run.info.status == "FAILED" and run.data.tags["gates.status"] == "failed"
    assert run.data.tags["gates.halt_detail"].startswith(first)
    assert f"crashing seed 1: failed (error): {first}" in project["faulty"].stdout
    assert len(ev["runs"]) == 24 and all(
        r["status"] == "completed" for r in others if (r["arm"], r["seed"]) != ("undeclared", 2)
    )
    assert ev["verdict"] == "supported"  # the decision reads other arms: their runs all count
    assert {"arm": "crashing", "seed": 1} not in [
        {"arm": x["arm"], "seed": x["seed"]} for x in ev["lost"]
    ]
    # the other contract's evidence and runs are untouched
    assert (
        project["root"] / "runs" / "circle-quadratic" / "evidence.json"
    ).read_bytes() == project["recorded"]


def test_run_returning_an_undeclared_metric_is_failed_by_name(project):
    ev, record, _, run = failed_run(project, "undeclared", 2)
    assert record["status"] == "failed"
    why = (
        "study 'faulty': run() returned metric 'accuracy', which the study does not declare; expected only "
        "metrics of FaultyStudy.metrics (train_loss, test_acc)"
    )
    assert record["halt_detail"] == why and run.data.tags["gates.halt_detail"] == why
    assert run.info.status == "FAILED" and "accuracy" not in record["metrics"]
    assert f"undeclared seed 2: failed (error): {why}" in project["faulty"].stdout
    other = next(r for r in ev["runs"] if (r["arm"], r["seed"]) == ("undeclared", 3))
    assert other["status"] == "completed"


def test_a_study_without_metric_declarations_is_refused_by_name(site, project):
    root = project["root"]
    path = root / "contracts" / "no-metrics.yaml"
    path.write_text(
        contract_text("no-metrics", "no_metrics", "linear: {features: linear}\nquadratic: {}")
    )
    line = path.read_text().splitlines().index("study: no_metrics") + 1
    for command in (
        ("check", "contracts/no-metrics.yaml"),
        ("run", "contracts/no-metrics.yaml", "--tracking-uri", project["uri"]),
    ):
        done = gates(root, *command, site=site)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.splitlines() == [
            f"error: contracts/no-metrics.yaml:{line}: study: study 'no_metrics' (faulty_study:NoMetrics, from "
            f"gates-faulty 0.1.0) breaks the study interface: no metric declarations: expected a class attribute "
            f"`metrics = {{name: gates.study.Metric(direction, role, low, high)}}` listing every metric `run` "
            f"reports and returns"
        ]
    assert not (root / "runs" / "no-metrics").exists()
    everything = gates(root, "studies", "--metrics", site=site)
    assert (
        everything.returncode == 2 and "my_study: Circle task" in everything.stdout
    )  # the others are shown
    assert "error: study 'no_metrics' (faulty_study:NoMetrics" in everything.stderr
    path.unlink()


def test_run_fetch_gets_a_missing_corpus_and_prints_its_license(site, project):
    root = project["root"]
    (root / "contracts" / "circle-corpus.yaml").write_text(
        contract_text(
            "circle-corpus",
            "corpus_circle",
            """
        linear:    {features: linear, corpus: "libreoffice-help:en"}
        quadratic: {features: quadratic, corpus: "libreoffice-help:en"}
    """,
        )
    )
    args = ("run", "contracts/circle-corpus.yaml", "--tracking-uri", project["uri"])
    missing = gates(root, *args, script=FAKE_APT, site=site)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.splitlines()[0].endswith(
        "arms.linear: arm cannot run here: corpus 'libreoffice-help' is not fetched; run: gates data fetch "
        "libreoffice-help"
    )
    assert not (root / "cache" / "corpora" / "libreoffice-help").exists()

    fetched = gates(root, *args, "--fetch", script=FAKE_APT, site=site)
    assert fetched.returncode == 0, fetched.stderr
    out = fetched.stdout
    assert "fetching corpus libreoffice-help (gates run --fetch)" in out
    assert "license: MPL-2.0 - Copyright 2000 Example Holder." in out and "LICENSE.txt" in out
    assert "sources for studies: libreoffice-help:en" in out
    assert out.index("license: MPL-2.0") < out.index("SUPPORTED  circle-corpus")
    again = gates(
        root, *args, "--fetch", script=FAKE_APT, site=site
    )  # present: verified, nothing downloaded
    assert (
        again.returncode == 0
        and "downloading" not in again.stdout
        and "fetching corpus" not in again.stdout
    )


def test_the_example_package_installs_with_pip(tmp_path):
    """The example's own pyproject.toml, installed by pip (offline, no dependencies), registers the study."""
    source = tmp_path / "src"
    shutil.copytree(
        EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    target = tmp_path / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    listed = gates(tmp_path, "studies", site=target)
    assert listed.returncode == 0, listed.stderr
    assert "my_study: my_study.study:MyStudy (gates-my-study 0.1.0)" in listed.stdout
