"""Devices (#12): what a run records about where it ran, the verdict signature, and a pinned device the
machine lacks. Tests run on the CPU; the CUDA paths are exercised by benchmarks/gpu_check.sh."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from gates.record import signature
from gates.record._evidence import devices_of
from gates.study import DeviceConfig, device_environment, device_unavailable, resolve_device
from tests.conftest import frozen_evidence, small_c05, write_contract


def test_device_field_accepts_auto_cpu_cuda_only():
    assert DeviceConfig().device == "auto"
    for choice in ("auto", "cpu", "cuda"):
        assert DeviceConfig(device=choice).device == choice
    for choice in ("tpu", "gpu", "cuda:0", "mps", ""):
        with pytest.raises(ValueError):
            DeviceConfig(device=choice)


def repository_studies() -> list[str]:
    """The studies this repository registers (pyproject.toml), so a new one is checked without a list here."""
    from pathlib import Path

    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    return sorted(pyproject["project"]["entry-points"]["gates.studies"])


@pytest.mark.parametrize("name", repository_studies())
def test_every_study_of_this_repository_takes_a_device(name):
    """Each study's arm config is a DeviceConfig (the field above); each study's test file checks that
    `device: cpu` gives the metrics of `auto` bit for bit on this CPU machine."""
    from gates.study import get_study

    config = get_study(name).Config
    assert issubclass(config, DeviceConfig) and config.model_fields["device"].default == "auto"


def test_environment_names_device_versions_threads_and_cpu_kernels():
    env = device_environment(DeviceConfig(device="cpu"))
    assert env == {
        "device": "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "threads": str(torch.get_num_threads()),
        "cpu": torch.backends.cpu.get_cpu_capability(),
    }
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


def test_signature_names_the_devices_and_old_evidence_keeps_its_signature():
    old = frozen_evidence("c05-structural-probe-v2")  # as recorded (tests/fixtures/claims)
    assert devices_of(old) == [] and "device:" not in signature(old)  # recorded before devices were
    new = {**old, "runs": [{**r, "environment": {"device": "cpu"}} for r in old["runs"]]}
    assert "|device:cpu|" in signature(new)
    mixed = {
        **new,
        "runs": new["runs"][:1]
        + [{**r, "environment": {"device": "cuda", "gpu": "NVIDIA H200"}} for r in new["runs"][1:]],
    }
    assert devices_of(mixed) == [
        "cpu",
        "cuda:NVIDIA H200",
    ] and "|device:cpu+cuda:NVIDIA H200|" in signature(mixed)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_pinned_cuda_arm_is_refused_where_there_is_none(workdir):
    assert "cuda" in device_unavailable(DeviceConfig(device="cuda"))
    assert device_unavailable(DeviceConfig(device="auto")) is None
    data = small_c05()
    data["arms"]["path_only"]["device"] = "cuda"
    write_contract(workdir / "contracts", data, "c05-small.yaml")
    for command in ("check", "run"):
        result = subprocess.run(
            [sys.executable, "-m", "gates", command, "contracts/c05-small.yaml"],
            capture_output=True,
            text=True,
            cwd=workdir,
        )
        assert result.returncode == 2, result.stderr
        assert "arms.path_only: arm cannot run here: the arm pins device cuda" in result.stderr
        assert "Traceback" not in result.stderr
    assert not (workdir / "runs" / "c05-small").exists()


def test_run_threads_option_sets_the_count_each_run_records(workdir):
    """`gates run --threads N` computes on N threads whatever the environment says, and each run records N
    (what an audit or replay re-runs it on)."""
    write_contract(workdir / "contracts", small_c05(), "c05-small.yaml")
    result = subprocess.run(
        [sys.executable, "-m", "gates", "run", "--threads", "2", "contracts/c05-small.yaml"],
        capture_output=True,
        text=True,
        cwd=workdir,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    evidence = json.loads((workdir / "runs" / "c05-small" / "evidence.json").read_text())
    assert {r["environment"]["threads"] for r in evidence["runs"]} == {"2"}


def test_retaining_freed_memory_changes_no_number():
    """The allocator setting `gates run` applies (gates/allocator.py) keeps buffers; results are the same."""
    code = (
        "import json, sys, torch\n"
        "from gates.execution import retain_freed_memory\n"
        "if sys.argv[1] == '1': assert retain_freed_memory()\n"
        "torch.manual_seed(0); w = torch.randn(512, 4000, requires_grad=True)\n"
        "for _ in range(3):\n"
        "    loss = torch.log_softmax(torch.randn(700, 512) @ w, -1).mean(); loss.backward()\n"
        "print(json.dumps([float(loss), float(w.grad.sum())]))\n"
    )
    outputs = [
        subprocess.run(
            [sys.executable, "-c", code, flag], capture_output=True, text=True, check=True
        ).stdout
        for flag in ("0", "1")
    ]
    assert outputs[0] == outputs[1]
