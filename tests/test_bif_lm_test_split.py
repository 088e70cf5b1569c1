"""bif_lm's optional test windows (test_windows > 0, for bif-fam-v2): validation from the held-out
stream's first half, test from its second half; test_windows = 0 (the default, every older contract)
keeps the validation windows, the metrics and the training exactly as before. And the v2 contract's
arms: parameters matched, the arms differ only in what the design says."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from gates.contract import Contract
from gates.models.bif_lm import (
    BifLM,
    BifLMConfig,
    BifLMStudy,
    heldout_halves,
    load_token_data,
    mlp_hidden_to_match,
    validation_set,
)
from gates.models.common import count_parameters
from gates.study import Budget, NullReporter
from tests.test_bif_lm import corpus, tiny  # noqa: F401 (the generated corpus, a module fixture)

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "contracts" / "bif-fam-v2.yaml"
STUDY = BifLMStudy()
ARMS = ("baseline", "bif", "bif_ablation")
OLD = {"train_loss", "val_loss", "val_ppl"}

pytestmark = pytest.mark.usefixtures("one_thread")


def test_test_metrics_are_declared_and_reported_only_with_test_windows():
    assert STUDY.metrics["test_loss"].role == STUDY.metrics["test_ppl"].role == "test"
    assert STUDY.reported_metrics(BifLMConfig()) == OLD  # the default: as before
    assert STUDY.reported_metrics(BifLMConfig(test_windows=8)) == OLD | {"test_loss", "test_ppl"}
    config = BifLMConfig(vocab_size=2000, test_windows=8)
    assert STUDY.chance("test_ppl", config) == 2000
    assert STUDY.chance("test_loss", config) == pytest.approx(math.log(2000))


def test_halves_split_the_heldout_stream_without_overlap():
    stream = np.arange(11, dtype=np.uint16)
    first, second = heldout_halves(stream)
    assert first.tolist() == list(range(5)) and second.tolist() == list(range(5, 11))


def test_validation_and_test_windows_come_from_the_two_halves(corpus):  # noqa: F811
    config = tiny(corpus, test_windows=8)
    heldout = load_token_data(config).heldout
    first, second = heldout_halves(heldout)
    val_inputs, _ = validation_set(first, config.seq_len, config.val_windows)
    test_inputs, test_targets = validation_set(second, config.seq_len, config.test_windows)
    half = len(first)
    # the first validation window starts the stream, the last test window ends it
    assert torch.equal(val_inputs[0], torch.from_numpy(heldout[:32].astype(np.int64)))
    assert torch.equal(test_targets[-1], torch.from_numpy(heldout[-32:].astype(np.int64)))
    assert torch.equal(test_inputs[0], torch.from_numpy(heldout[half : half + 32].astype(np.int64)))


def test_a_run_with_test_windows_trains_exactly_like_one_without(corpus):  # noqa: F811
    """The test windows are only scored: the same training (train_loss bit for bit), test_ppl =
    exp(test_loss); without them the run reports exactly the old metrics."""
    histories = {}
    for windows in (0, 8):
        reporter = NullReporter(Budget(steps=20, eval_every=10))
        final = STUDY.run(tiny(corpus, arm="bif", test_windows=windows), 2, reporter)
        assert set(final) == STUDY.reported_metrics(tiny(corpus, test_windows=windows))
        histories[windows] = reporter.history
    assert [m["train_loss"] for _, m in histories[0]] == [m["train_loss"] for _, m in histories[8]]
    last = histories[8][-1][1]
    assert np.isclose(last["test_ppl"], np.exp(last["test_loss"]))
    assert last["test_loss"] < math.log(100)  # learned something: below uniform over 100 pieces


def test_v2_contract_arms_match_parameters_and_differ_only_in_the_design():
    contract = Contract.model_validate(yaml.safe_load(CONTRACT.read_text()))
    assert contract.supersedes == "bif-fam"
    configs = {arm: BifLMConfig.model_validate(raw) for arm, raw in contract.arms.items()}
    assert {c.arm for c in configs.values()} == set(ARMS)
    counts = {arm: STUDY.param_count(c) for arm, c in configs.items()}
    spread = (max(counts.values()) - min(counts.values())) / min(counts.values())
    assert spread <= contract.preflight.capacity_match.tolerance == 0.02, counts
    base = configs["baseline"]
    assert base.test_windows > 0  # the decision reads test metrics
    for c in configs.values():
        if c.arm != "baseline":
            assert c.mlp_hidden == mlp_hidden_to_match(c, STUDY.param_count(base))
    shared = {k: v for k, v in base.model_dump().items() if k not in ("arm", "mlp_hidden")}
    for c in configs.values():
        assert {k: v for k, v in c.model_dump().items() if k not in ("arm", "mlp_hidden")} == shared
    # FAM's k^2 scores against the ablation's q, k maps of exactly k^2 (2 d r), plus its LayerNorm's 2 d
    ablation = configs["bif_ablation"]
    fam = count_parameters(BifLM(configs["bif"]).first.mixer)
    compressed = count_parameters(BifLM(ablation).first.mixer)
    assert fam == configs["bif"].alpha_dim ** 2 == 2 * ablation.d_model * ablation.ablation_width
    assert compressed == fam + 2 * ablation.d_model
