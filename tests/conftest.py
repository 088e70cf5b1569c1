"""Shared fixtures: small, real C05 contracts written to a temp folder (fast enough for CI), and copies
of frozen committed claims (tests/fixtures/claims) in a temp project."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
C05 = ROOT / "contracts" / "c05-structural-probe.yaml"


def _share_the_cores() -> None:
    """Under pytest-xdist, each worker computes on its share of the cores (and so do the `gates`
    processes its tests start, through OMP_NUM_THREADS): N workers each on torch's default of every
    core would oversubscribe them, and busy-waiting OpenMP threads slow small models many times over."""
    from gates.execution._processes import threads_per_job

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = threads_per_job(workers)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


_share_the_cores()

# The Ray instances tests start (and the `gates run --executor ray` processes they start, which inherit
# it) listen on loopback only: Ray reads the switch when it is first imported, so it is set before any
# test imports Ray (gates/execution/_ray.py, LOOPBACK_ONLY).
from gates.execution._ray import LOOPBACK_ONLY  # noqa: E402

for _key, _value in LOOPBACK_ONLY.items():
    os.environ.setdefault(_key, _value)

# Tests record into throwaway projects from a working tree that is being edited: let them (the
# refusal itself is tested with this unset, tests/test_uncommitted.py). Subprocesses inherit it.
os.environ["GATES_ALLOW_UNCOMMITTED"] = "1"


# What the committed C05 contract (recorded before the design rules of gates/design/_rules.py) lacks to be
# registered today: the factor under test, why the baselines fail by construction, positive controls
# that the arms asserted to fail in refuted_if (the subheap arms) work where they can, a convergence
# rule, and seeds as a count.
C05_BLIND = {
    "flat_address": "sees only the address id, never a node value: it cannot locate a pattern placed at random",
    "path_only": "sees only the L/R path, never a node value: it cannot locate a pattern placed at random",
}
# The subheap arms find the pattern on held-out trees of their training depths: their val_loss (log scale,
# chance about 2.3 nats: log of the node count) far below 0.5 nats. A loss, not val_acc: a test-sized run
# reaches val_acc 1.0 on every seed, where only the sign test applies (p 1/4 at 2 seeds: never holds).
C05_CONTROLS = [
    {
        "kind": "threshold",
        "arm": arm,
        "metric": "val_loss",
        "direction": "lower",
        "value": 0.5,
        "control": "positive",
    }
    for arm in ("subheap_kernel", "path_subheap_kernel")
]


def c05_current() -> dict:
    """The committed C05 contract (its claim, arms, budget and decision) with what today's design rules
    ask of a new contract added: `gates check` says "ready to run"."""
    data = copy.deepcopy(yaml.safe_load(C05.read_text()))
    data["factor"] = ["features"]
    data["blind"] = dict(C05_BLIND)
    data["controls"] = copy.deepcopy(C05_CONTROLS)
    data["convergence"] = {"metric": "train_acc", "window": 100, "max_rel_improvement": 0.02}
    data["seeds"] = len(data["seeds"])
    data["decision"] = copy.deepcopy(C05_LOSS_DECISION)
    return data


# The decision of c05_current: its accuracy bars as test-loss bars (positive, log scale: the t-test of
# their geometric means). At 3 seeds no test of a median or of a bounded metric's mean (the committed
# contract's accuracies) can reach alpha (engine 4), so the design rules would refuse it.
_C05_LOSS_BARS = (  # (arm, the direction the claim asserts, bar)
    ("subheap_kernel", "lower", 0.5),
    ("path_subheap_kernel", "lower", 0.5),
    ("flat_address", "higher", 2.0),
    ("path_only", "higher", 2.0),
)
_FLIP = {"lower": "higher", "higher": "lower"}
C05_LOSS_DECISION = {
    "alpha": 0.05,
    **{
        name: [
            {"kind": "threshold", "arm": arm, "metric": "test_loss", "direction": d, "value": v}
            for arm, asserted, v in _C05_LOSS_BARS
            for d in [asserted if name == "supported_if" else _FLIP[asserted]]
        ]
        for name in ("supported_if", "refuted_if")
    },
}


def small_c05(**overrides) -> dict:
    """The committed C05 contract brought to today's design rules (`c05_current`), shrunk so that a whole
    run takes a few seconds. Its budget is far too small to judge convergence: `no_convergence` says so."""
    data = c05_current()
    data["id"] = "c05-small"
    data.pop("replay", None)
    for cfg in data["arms"].values():
        cfg.update(train_trees=120, test_trees=60)
    data["seeds"] = 3
    data.pop("convergence")
    data["no_convergence"] = (
        "a test-sized run (60 steps): too short for its learning curves to flatten"
    )
    data["budget"] = {"steps": 60, "eval_every": 20}
    data["preflight"]["falsifiable_point"]["by_step"] = 60
    data["stop_rules"]["futility"][0]["at_step"] = 40
    data["stop_rules"]["futility"][0]["window"] = 20
    for key, value in overrides.items():
        data[key] = value
    return data


# Frozen copies of committed claims (tests/fixtures/README.md). No test reads the repository's runs/:
# `gates run`, users and re-derivations by a newer verdict engine rewrite it.
FIXTURES = ROOT / "tests" / "fixtures" / "claims"
FIXTURE_CONTRACTS = FIXTURES / "contracts"
FIXTURE_RUNS = FIXTURES / "runs"
FIXTURE_CLAIMS = tuple(sorted(p.stem for p in FIXTURE_CONTRACTS.glob("*.yaml")))
REDERIVED = "fixture brought to today's engine"


def _fixture(contract_id: str) -> tuple[Path, Path]:
    contract, folder = FIXTURE_CONTRACTS / f"{contract_id}.yaml", FIXTURE_RUNS / contract_id
    if not contract.is_file() or not (folder / "evidence.json").is_file():
        raise LookupError(
            f"no frozen copy of claim {contract_id!r} in {FIXTURES} (there are: "
            f"{', '.join(FIXTURE_CLAIMS)}); see tests/fixtures/README.md to add one"
        )
    return contract, folder


def frozen_evidence(contract_id: str) -> dict:
    """A claim's evidence as it was recorded and frozen (engine 2): for facts no verdict engine changes
    (per-seed values, recorded commit and code hashes). Read only."""
    import json

    return json.loads((_fixture(contract_id)[1] / "evidence.json").read_text())


def copy_claims(folder: Path, *contract_ids: str, rederive: bool = True) -> Path:
    """folder/project with contracts/ and runs/ holding copies of these frozen claims (all of them when
    none is named), entered in a fresh runs/INDEX.jsonl (`backfilled`) and brought to today's verdict
    engine (gates.execution._runner.rederive: evidence.json and verdict.md rewritten, and a `rederived` entry
    appended, only where today's engine derives another record), so that `gates verify` holds on the
    copies. rederive=False: the frozen bytes, no index."""
    import shutil

    from gates.contract import load_contract
    from gates.execution import rederive as rederive_claim
    from gates.record._writer import backfill_index

    root = folder / "project"
    (root / "contracts").mkdir(parents=True)
    (root / "runs").mkdir()
    ids = contract_ids or FIXTURE_CLAIMS
    for contract_id in ids:
        contract, evidence = _fixture(contract_id)
        shutil.copy(contract, root / "contracts")
        shutil.copytree(evidence, root / "runs" / contract_id)
    if rederive:
        backfill_index(root / "runs")
        for contract_id in ids:
            rederive_claim(
                load_contract(root / "contracts" / f"{contract_id}.yaml"), root / "runs", REDERIVED
            )
    return root


def run_project(root: Path, *contracts: dict) -> Path:
    """A project at `root` with these contracts in contracts/<id>.yaml, each run (recorded) into
    root/runs and the MLflow store root/mlflow.db, as `gates run` in that folder would."""
    from tests.helpers import new_project

    return new_project(root, *contracts)


@pytest.fixture(scope="session")
def make_project(tmp_path_factory):
    """make_project(*contracts, name="project", claims=..., copy_of=..., record=..., git=...): a new
    project in a fresh temporary folder (tests.helpers.new_project: its options), for a test or a module
    fixture (`recorded`) alike: its root."""
    from tests.helpers import new_project

    def make(*contracts, name: str = "project", **options) -> Path:
        return new_project(tmp_path_factory.mktemp(name), *contracts, **options)

    return make


@pytest.fixture
def project(recorded, make_project):
    """A copy of the module's recorded project (its `recorded` fixture, module-scoped: a project with
    contracts run into it) that one test may change; a module may define its own `project`."""
    return make_project(copy_of=recorded)


def regenerate_history(runs_root: Path) -> None:
    """Throw the claims history away and enter the evidence as it now is (`backfilled`): what a forger
    can do where the history is not in git (`gates verify` compares it across commits otherwise)."""
    from gates.record import index_path
    from gates.record._writer import backfill_index

    index_path(runs_root).unlink()
    backfill_index(runs_root)


def git(root: Path, *args: str) -> None:
    """A git command in `root` by a throwaway identity (a test's own repository)."""
    import subprocess

    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


def write_contract(folder: Path, data: dict, name: str = "contract.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A project-like folder (contracts/, runs/) as the current directory."""
    (tmp_path / "contracts").mkdir()
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a busy machine OpenMP threads wait on each other.
    Use per module: `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@contextlib.contextmanager
def generated_corpus(root: Path, name: str, lines: list[str]):
    """A module fixture's corpus: `lines` written to root/name and, while in use, a private cache
    (TREEHEAP_GATES_CACHE = root/cache) for the tokenizers and teachers trained on it."""
    path = root / name
    path.write_text("\n".join(lines) + "\n")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TREEHEAP_GATES_CACHE", str(root / "cache"))
        yield path


@contextlib.contextmanager
def tiny_teacher(root: Path):
    """tests/test_teacher.py's tiny teacher trained (once, on one thread) on its generated grammar, in a
    private cache under `root`: the TeacherConfig, while in use."""
    from gates.models.teacher import TeacherConfig, load_or_train
    from tests.test_teacher import TINY, grammar_lines

    with generated_corpus(root, "corpus.txt", grammar_lines(0, 3000)) as corpus:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            config = TeacherConfig(corpus=str(corpus), **TINY)
            load_or_train(config, log=lambda _: None)
            yield config
        finally:
            torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------- backends
# a job process's threads, as the driver's
JOB_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def sigint_as_in_a_terminal() -> None:
    """preexec_fn of a command a Ctrl-C test interrupts: SIGINT at its default, as a terminal's
    foreground job has it. A shell's background job (`pytest ... &`, nohup) ignores SIGINT, the child
    inherits that, and Python then installs no KeyboardInterrupt: the run goes on to the end (exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_missed(rest: str, errors: str) -> str:
    """Why `gates run --json` did not stop at a SIGINT, for a failure message: how many runs ended after
    it (none or few: the run had ended before the signal came; many: the interrupt was lost), and
    stderr."""
    ended = sum(json.loads(line).get("event") == "run" for line in rest.splitlines() if line)
    return f"{ended} run(s) ended after the SIGINT; stderr: {errors[-3000:]!r}"


def dist_contract(contract_id: str = "c05-dist", seeds=(0, 1, 2), steps: int = 400) -> dict:
    """Small C05 (12 jobs of about a second each), with a relative futility rule: `path_only` is judged
    against the best other arm of its seed, so it must run after them (and halts: it is far behind)."""
    data = small_c05(id=contract_id)
    for cfg in data["arms"].values():
        cfg.update(train_trees=400, test_trees=60)
    data["seeds"] = list(seeds)
    data["budget"] = {"steps": steps, "eval_every": 20}
    data["preflight"]["falsifiable_point"]["by_step"] = steps
    data["stop_rules"]["futility"].append(
        {
            "metric": "test_acc",
            "at_step": 200,
            "behind_best_other_by": 0.5,
            "window": 100,
            "min_rel_improvement": 0.5,
            "arms": ["path_only"],
        }
    )
    return data


def comparable(evidence: dict) -> dict:
    """What must agree between runs of the same contract on different backends."""
    return {
        "verdict": evidence["verdict"],
        "contract_sha256": evidence["contract_sha256"],
        "conditions": [
            (c["list_name"], c["index"], c["outcome"], c["values"]) for c in evidence["conditions"]
        ],
        "runs": [
            (r["arm"], r["seed"], r["status"], r["halt_reason"], r["metrics"], r["first_signal"])
            for r in evidence["runs"]
        ],
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """`dist_contract` run in this process (a plain `gates run`), its evidence as evidence.json holds it:
    what a run on other backends must give."""
    from gates.contract import load_contract
    from tests.helpers import run_contract

    root = tmp_path_factory.mktemp("reference")
    path = write_contract(root, dist_contract(), "c05-dist.yaml")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        evidence = run_contract(
            load_contract(path), f"sqlite:///{root / 'mlflow.db'}", root / "runs"
        ).as_dict()
    finally:
        os.chdir(cwd)
    halted = {(r["arm"], r["seed"]) for r in evidence["runs"] if r["status"] == "halted"}
    # the relative rule needs the other arms first
    assert halted == {("path_only", 0), ("path_only", 1), ("path_only", 2)}
    return evidence
