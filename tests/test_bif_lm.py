"""bif_lm: the split and tokenizer cache, the fixed validation set, causality of every arm (FAM
first), parameter matching at the contract's sizes, FLOPs by hand, config validation, and that a
tiny real run learns. Data is a small generated English-like text file (no corpus fetch needed)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from pydantic import ValidationError

from gates.contract import Contract
from gates.models.bif_lm import (
    ALPHA_STD,
    FAM,
    BifLM,
    BifLMConfig,
    BifLMStudy,
    CausalSelfAttention,
    CompressedAttention,
    causal_mix,
    causal_softmax,
    forward_flops,
    load_token_data,
    mlp_hidden_to_match,
    optimizer_for,
    sample_windows,
    split_lines,
    tokenizer_key,
    validation_set,
)
from gates.models.common import count_parameters, seed_everything
from gates.study import Budget, NullReporter
from tests.conftest import generated_corpus

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "contracts" / "bif-fam.yaml"
STUDY = BifLMStudy()
ARMS = ("baseline", "bif", "bif_ablation")


def help_like_lines(count: int, seed: int = 0) -> list[str]:
    """Short help-page sentences from a small grammar: enough structure for a tiny LM to learn."""
    rng = random.Random(seed)
    menus = [
        "Format",
        "Insert",
        "Edit",
        "View",
        "Tools",
        "Table",
        "Sheet",
        "Data",
        "Window",
        "Help",
    ]
    items = [
        "Cells",
        "Columns",
        "Rows",
        "Styles",
        "Fields",
        "Options",
        "Comments",
        "Sections",
        "Pages",
        "Frames",
    ]
    things = [
        "dialog",
        "toolbar",
        "sidebar",
        "spreadsheet",
        "document",
        "formula",
        "chart",
        "selection",
        "paragraph",
        "template",
        "macro",
        "filter",
        "range",
        "index",
        "bookmark",
        "hyperlink",
    ]
    verbs = [
        "opens",
        "closes",
        "changes",
        "formats",
        "inserts",
        "deletes",
        "selects",
        "shows",
        "hides",
        "sorts",
    ]
    adjectives = [
        "current",
        "selected",
        "new",
        "default",
        "active",
        "hidden",
        "empty",
        "whole",
        "next",
        "first",
    ]
    templates = [
        "Choose {m} - {i} to open the {t} {t2}.",
        "The {t} {v} the {a} {t2} in the {a2} {t3}.",
        "To {v0} a {t}, select the {a} {t2} and choose {m} - {i}.",
        "This command {v} the {a} {t} of the {t2}.",
        "Click the {a} {t} and then press Enter to {v0} it.",
    ]
    lines = []
    for _ in range(count):
        verb = rng.choice(verbs)
        lines.append(
            rng.choice(templates).format(
                m=rng.choice(menus),
                i=rng.choice(items),
                t=rng.choice(things),
                t2=rng.choice(things),
                t3=rng.choice(things),
                v=verb,
                v0=verb[:-1] if verb.endswith("s") else verb,
                a=rng.choice(adjectives),
                a2=rng.choice(adjectives),
            )
        )
    return lines


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A generated .txt corpus and a private tokenizer cache (TREEHEAP_GATES_CACHE) for this module."""
    root = tmp_path_factory.mktemp("bif")
    with generated_corpus(root, "help.txt", help_like_lines(3000)) as path:
        yield path


def tiny(corpus: Path, **overrides) -> BifLMConfig:
    """A config small enough to train in a second or two on one CPU core."""
    settings = dict(
        corpus=str(corpus),
        vocab_size=100,
        seq_len=32,
        val_windows=16,
        d_model=32,
        layers=2,
        heads=2,
        mlp_hidden=64,
        alpha_dim=16,
        batch_size=8,
        lr=1e-2,
        warmup_steps=5,
    )
    return BifLMConfig(**{**settings, **overrides})


# ------------------------------------------------------------------------------------ data
def test_split_depends_on_text_not_order():
    lines = help_like_lines(2000, seed=1) + [f"line number {i}" for i in range(2000)]
    train, heldout = split_lines(lines, 0.9)
    shuffled = lines[:]
    random.Random(5).shuffle(shuffled)
    train2, heldout2 = split_lines(shuffled, 0.9)
    assert set(train) == set(train2) and set(heldout) == set(heldout2)
    assert not set(train) & set(heldout)  # equal lines land together
    unique = set(lines)
    assert 0.85 < len(set(train)) / len(unique) < 0.95
    assert heldout == [line for line in lines if line in set(heldout)]  # corpus order kept


def test_tokenizer_is_cached_atomically_and_rebuilt_when_damaged(corpus):
    config = tiny(corpus)
    data = load_token_data(config)
    folder = data.folder
    assert folder.parent.name == "tokenizers" and folder.name == tokenizer_key(config)
    meta = json.loads((folder / "tokenizer.json").read_text())
    assert meta["pieces"] == 100 and set(meta["files"]) == {
        "tokenizer.model",
        "train_tokens.npy",
        "heldout_tokens.npy",
    }
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp left behind
    assert data.train.max() < 100 and data.heldout.max() < 100
    # a second load reads the cache (same files, untouched)
    stamp = (folder / "tokenizer.json").stat().st_mtime_ns
    again = load_token_data(config)
    assert (
        np.array_equal(again.train, data.train)
        and (folder / "tokenizer.json").stat().st_mtime_ns == stamp
    )
    # the key follows the tokenizer settings and the data, not the model's sizes
    assert tokenizer_key(tiny(corpus, vocab_size=90)) != tokenizer_key(config)
    assert tokenizer_key(tiny(corpus, d_model=48)) == tokenizer_key(config)
    # an edited stream no longer matches tokenizer.json: rebuilt, and the rebuild is identical
    np.save(folder / "train_tokens.npy", data.train[:100])
    rebuilt = load_token_data(config)
    assert np.array_equal(rebuilt.train, data.train)
    assert rebuilt.meta["files"] == meta["files"]  # deterministic tokenizer: the same bytes


def test_validation_set_is_fixed_whatever_the_seed(corpus):
    config = tiny(corpus)
    heldout = load_token_data(config).heldout
    sets = []
    for seed in (0, 1):
        seed_everything(seed)
        torch.rand(3)  # disturb the global generators further
        sets.append(validation_set(heldout, config.seq_len, config.val_windows))
    (inputs, targets), (inputs2, targets2) = sets
    assert torch.equal(inputs, inputs2) and torch.equal(targets, targets2)
    assert inputs.shape == (16, 32) and torch.equal(
        inputs[:, 1:], targets[:, :-1]
    )  # next-token targets
    assert torch.equal(inputs[0], torch.from_numpy(heldout[:32].astype(np.int64)))  # first and last
    assert torch.equal(
        targets[-1], torch.from_numpy(heldout[-32:].astype(np.int64))
    )  # windows included
    # while the training batches do depend on the seed
    train = torch.from_numpy(load_token_data(config).train.astype(np.int64))
    batch = lambda seed: sample_windows(train, 4, 32, torch.Generator().manual_seed(seed))[0]  # noqa: E731
    assert torch.equal(batch(0), batch(0)) and not torch.equal(batch(0), batch(1))


# ------------------------------------------------------------------------------------ model
@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_is_causal(corpus, arm):
    """Changing tokens at positions >= t changes no output before t, and does change outputs at >= t."""
    config = tiny(corpus, arm=arm)
    torch.manual_seed(0)
    model = BifLM(config).eval()
    tokens = torch.randint(0, config.vocab_size, (3, config.seq_len))
    changed = tokens.clone()
    t = 11
    changed[:, t:] = torch.randint(0, config.vocab_size, (3, config.seq_len - t))
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :t], after[:, :t])
    assert not torch.allclose(before[:, t:], after[:, t:])


def test_fam_mixes_only_the_past_by_static_recipes():
    config = BifLMConfig(arm="bif", d_model=32, alpha_dim=8, heads=2)
    torch.manual_seed(0)
    fam = FAM(config)
    alpha, x = 0.02 * torch.randn(2, 10, 8), torch.randn(2, 10, 32)
    out = fam(x, alpha)
    assert torch.allclose(out[:, 0], x[:, 0])  # position 0 sees only itself
    future_x, future_alpha = x.clone(), alpha.clone()
    future_x[:, 6:] += 1.0
    future_alpha[:, 6:] += 0.05
    assert torch.equal(fam(future_x, future_alpha)[:, :6], out[:, :6])
    # out_i is a convex combination of x_0..x_i with weights softmax_j(alpha_i W' alpha_j^T)
    recipe = alpha / 0.02
    weights = torch.softmax(recipe[0, 4] @ fam.W @ recipe[0, :5].T, dim=0)
    assert torch.allclose(out[0, 4], weights @ x[0, :5], atol=1e-5)
    assert count_parameters(fam) == 8 * 8


def test_contract_arms_match_parameters_within_two_percent():
    data = yaml.safe_load(CONTRACT.read_text())
    contract = Contract.model_validate(data)
    configs = {arm: BifLMConfig.model_validate(raw) for arm, raw in contract.arms.items()}
    assert {c.arm for c in configs.values()} == set(ARMS)
    counts = {arm: STUDY.param_count(c) for arm, c in configs.items()}
    spread = (max(counts.values()) - min(counts.values())) / min(counts.values())
    assert spread <= contract.preflight.capacity_match.tolerance == 0.02, counts
    assert set(contract.preflight.capacity_match.arms) == set(ARMS)
    # the matching widths are the ones the helper computes (the contract states them, computed once)
    base = next(c for c in configs.values() if c.arm == "baseline")
    for c in configs.values():
        if c.arm != "baseline":
            assert c.mlp_hidden == mlp_hidden_to_match(c, STUDY.param_count(base))
    # the arms differ only in what the study's design says they differ in
    shared = {k: v for k, v in base.model_dump().items() if k not in ("arm", "mlp_hidden")}
    for c in configs.values():
        assert {k: v for k, v in c.model_dump().items() if k not in ("arm", "mlp_hidden")} == shared
    # FAM is k^2 parameters; the ablation's mixer about the same (2 d r + its LayerNorm's 2 d)
    bif = next(c for c in configs.values() if c.arm == "bif")
    ablation = next(c for c in configs.values() if c.arm == "bif_ablation")
    fam = count_parameters(BifLM(bif).first.mixer)
    compressed = count_parameters(BifLM(ablation).first.mixer)
    assert fam == bif.alpha_dim**2
    assert compressed == 2 * ablation.d_model * ablation.ablation_width + 2 * ablation.d_model
    assert abs(compressed - fam) / fam < 0.1


def test_contract_loads_through_the_platform():
    from gates.contract import load_contract
    from gates.study import study_names

    if "bif_lm" not in study_names():
        pytest.skip("entry point gates.studies:bif_lm is not registered (pyproject.toml)")
    loaded = load_contract(CONTRACT)
    assert loaded.study.name == "bif_lm" and set(loaded.arm_configs) == set(ARMS)


def test_flops_by_hand():
    V, d, k, T, m, L, r = 100, 16, 8, 10, 24, 3, 2  # r = k^2 / (2 d) = 2
    common = dict(vocab_size=V, d_model=d, alpha_dim=k, seq_len=T, mlp_hidden=m, layers=L, heads=2)
    block = 4 * d * d + 2 * T * d + 2 * d * m
    assert forward_flops(BifLMConfig(arm="baseline", **common)) == 2 * (L * block + d * V)
    tail = (
        2 * d * m + (L - 1) * block + k * d + d * k + k * V
    )  # MLP 1, blocks 2..L, alpha B, the head
    assert forward_flops(BifLMConfig(arm="bif", **common)) == 2 * (k * k + T * k + T * d + tail)
    assert forward_flops(BifLMConfig(arm="bif_ablation", **common)) == 2 * (
        2 * d * r + T * r + T * d + tail
    )
    assert BifLMConfig(arm="bif_ablation", **common).ablation_width == r


# ------------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "bad",
    [
        dict(arm="fam"),
        dict(d_model=100, heads=3),
        dict(arm="bif", alpha_dim=128, d_model=128),
        dict(arm="bif_ablation", alpha_dim=200),
        dict(vocab_size=70000),
        dict(train_fraction=1.0),
        dict(seq_len=4),
        dict(lr=0),
        dict(layers=0),
        dict(min_lr_ratio=1.5),
        dict(epochs=3),
    ],
)
def test_config_rejects(bad):
    with pytest.raises(ValidationError):
        BifLMConfig(**bad)


def test_check_ready_names_a_missing_file(tmp_path):
    assert "not found" in STUDY.check_ready(BifLMConfig(corpus=str(tmp_path / "none.txt")))


# ------------------------------------------------------------------------------------ runs
@pytest.mark.parametrize("arm", ARMS)
def test_a_tiny_run_learns(corpus, arm):
    reporter = NullReporter(Budget(steps=60, eval_every=10))
    final = STUDY.run(tiny(corpus, arm=arm), seed=0, reporter=reporter)
    first = reporter.history[0][1]
    assert [s for s, _ in reporter.history] == [10, 20, 30, 40, 50, 60]
    assert set(final) == STUDY.reported_metrics(tiny(corpus, arm=arm))  # no test windows: no test_*
    assert final["train_loss"] < first["train_loss"] - 0.5, reporter.history
    assert final["val_loss"] < first["val_loss"] - 0.5, reporter.history
    assert np.isclose(final["val_ppl"], np.exp(final["val_loss"]))


def test_runs_are_reproducible_and_seeds_differ(corpus):
    config = tiny(corpus, arm="bif")
    runs = [
        STUDY.run(config, seed, NullReporter(Budget(steps=12, eval_every=6))) for seed in (3, 3, 4)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


# ------------------------------------------------------------------------------------ device
@pytest.mark.skipif(torch.cuda.is_available(), reason="auto resolves to cuda on this machine")
def test_cpu_gives_the_metrics_of_auto_bit_for_bit(corpus):
    config = tiny(corpus, arm="bif")
    runs = {device: NullReporter(Budget(steps=12, eval_every=6)) for device in ("auto", "cpu")}
    finals = {
        device: STUDY.run(config.model_copy(update={"device": device}), 1, reporter)
        for device, reporter in runs.items()
    }
    assert finals["cpu"] == finals["auto"]
    assert runs["cpu"].history == runs["auto"].history


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_cuda_arm_is_refused_without_a_gpu(corpus):
    why = STUDY.why_not_ready(tiny(corpus, device="cuda"))
    assert why and "cuda" in why.lower()
    assert STUDY.why_not_ready(tiny(corpus, device="cpu")) is None


# ------------------------------------------------------------------------------------ the optimised step
# The step before #12, kept here as the reference: each mixer built its (B, [heads,] T, T) scores,
# masked them with a fresh mask and multiplied the softmax by the values; windows were gathered with
# an index tensor; AdamW ran its per-tensor loop.
def _old_attention(self, x):
    B, T, d = x.shape
    q, k, v = (
        t.view(B, T, self.heads, d // self.heads).transpose(1, 2)
        for t in self.qkv(x).split(d, dim=2)
    )
    attention = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads))
    return self.out((attention @ v).transpose(1, 2).reshape(B, T, d))


def _old_fam(self, x, alpha):
    recipe = alpha / ALPHA_STD
    return causal_softmax((recipe @ self.W) @ recipe.transpose(1, 2)) @ x


def _old_compressed(self, x, alpha):
    z = self.norm(x)
    return causal_softmax(self.W_q(z) @ self.W_k(z).transpose(1, 2) / math.sqrt(self.width)) @ x


def _old_windows(stream, rows, seq_len, generator):
    starts = torch.randint(0, len(stream) - seq_len, (rows,), generator=generator)
    windows = stream[starts[:, None] + torch.arange(seq_len + 1)[None, :]]
    return windows[:, :-1], windows[:, 1:]


@pytest.mark.parametrize("arm", ARMS)
def test_the_optimised_step_equals_the_previous_one(corpus, arm, monkeypatch):
    config = tiny(corpus, arm=arm)
    stream = torch.from_numpy(load_token_data(config).train.astype(np.int64))

    def losses(old: bool) -> list[float]:
        with monkeypatch.context() as patch:
            if old:
                patch.setattr(CausalSelfAttention, "forward", _old_attention)
                patch.setattr(FAM, "forward", _old_fam)
                patch.setattr(CompressedAttention, "forward", _old_compressed)
            torch.manual_seed(0)
            model = BifLM(config)
            optimizer = (
                torch.optim.AdamW(
                    model.parameters(),
                    lr=config.lr,
                    betas=(0.9, 0.95),
                    weight_decay=config.weight_decay,
                )
                if old
                else optimizer_for(model, config)
            )
            generator = torch.Generator().manual_seed(0)
            result = []
            for _ in range(4):
                inputs, targets = (_old_windows if old else sample_windows)(
                    stream, config.batch_size, config.seq_len, generator
                )
                loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                result.append(loss.item())
            return result

    old, new = losses(old=True), losses(old=False)
    assert np.allclose(new, old, rtol=0, atol=1e-5), (new, old)


def test_the_fused_mixers_equal_softmax_of_masked_scores():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 9, 4), torch.randn(2, 3, 9, 4), torch.randn(2, 3, 9, 6)
    reference = causal_softmax(q @ k.transpose(-2, -1) * 0.7) @ v
    assert torch.allclose(causal_mix(q, k, v, 0.7), reference, atol=1e-6)
    windows = torch.arange(100)
    for old, new in zip(
        _old_windows(windows, 5, 7, torch.Generator().manual_seed(3)),
        sample_windows(windows, 5, 7, torch.Generator().manual_seed(3)),
    ):
        assert torch.equal(old, new)
