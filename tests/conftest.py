"""Shared fixtures: small, real C05 contracts written to a temp folder (fast enough for CI)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
C05 = ROOT / "contracts" / "c05-structural-probe.yaml"


def small_c05(**overrides) -> dict:
    """The committed C05 contract, shrunk so that a whole run takes a few seconds."""
    data = yaml.safe_load(C05.read_text())
    data = copy.deepcopy(data)
    data["id"] = "c05-small"
    data.pop("replay", None)
    for cfg in data["arms"].values():
        cfg.update(train_trees=120, test_trees=60)
    data["seeds"] = [0, 1]
    data["budget"] = {"steps": 60, "eval_every": 20}
    data["preflight"]["falsifiable_point"]["by_step"] = 60
    data["stop_rules"]["futility"][0]["at_step"] = 40
    data["stop_rules"]["futility"][0]["window"] = 20
    for key, value in overrides.items():
        data[key] = value
    return data


def copy_claims(folder: Path, *contract_ids: str) -> Path:
    """folder/project with contracts/ and runs/ holding copies of these committed claims."""
    import shutil

    root = folder / "project"
    (root / "contracts").mkdir(parents=True)
    (root / "runs").mkdir()
    for contract_id in contract_ids:
        shutil.copy(ROOT / "contracts" / f"{contract_id}.yaml", root / "contracts")
        shutil.copytree(ROOT / "runs" / contract_id, root / "runs" / contract_id)
    return root


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
