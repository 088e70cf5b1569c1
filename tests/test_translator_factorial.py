"""Issue #31: the translator's encoder x reader factorial (arm `factorial` with `encoder` and `reader`).

Every cell builds, reads no padding, trains; the cells' encoder + reader parameters agree within 5% at
the draft contract's sizes; the relaying Butterfly differs from the Butterfly only on sequences shorter
than N; and the arms that existed before are untouched (their configs validate, a tiny run gives the
numbers the code gave before the factorial existed)."""

from __future__ import annotations

import itertools
import pathlib

import pytest
import torch
import yaml
from pydantic import ValidationError
from test_treeheap_translator import _randomise, _tiny, _toy_examples

from gates.models.translation_data import PAD, collate
from gates.models.treeheap_translator.model import (
    ENCODERS,
    READERS,
    WIDTH_OF_ENCODER,
    Translator,
    forward_flops,
    matched_width,
    parameter_parts,
    token_nll,
)
from gates.models.treeheap_translator.study import (
    TranslatorConfig,
    TranslatorStudy,
    applicable_interventions,
    mean_nll,
)

pytestmark = pytest.mark.usefixtures("one_thread")
STUDY = TranslatorStudy()
CELLS = list(itertools.product(ENCODERS, READERS))
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _cell(encoder: str, reader: str, **kw) -> TranslatorConfig:
    return _tiny("factorial", encoder=encoder, reader=reader, heads=4, butterfly_hidden=24, **kw)


@pytest.mark.parametrize(("encoder", "reader"), CELLS)
def test_every_cell_builds_reads_no_padding_and_trains(encoder, reader):
    torch.manual_seed(0)
    config = _cell(encoder, reader)
    model = Translator(config, 20)
    examples = _toy_examples(8)
    batch = model.batch(examples)
    memory = model.encode(batch["src"], batch["src_mask"])
    assert memory["h0"].shape == (8, config.d_model)  # every cell: h_0 from the encoder's mean
    decoded = model(batch)
    tokens = int((batch["tgt_out"] != PAD).sum())
    assert decoded.logits.shape == (tokens, 20)
    if reader == "mha":
        assert decoded.masses is None
    else:  # READ's stopped mass / all_nodes' weights, one per node, summing to 1
        assert decoded.masses.shape == (tokens, 2 * config.n_leaves - 1)
        assert torch.allclose(decoded.masses.sum(-1), torch.ones(tokens), atol=1e-5)
    # garbage in the empty leaves changes nothing (the relay zeroes them before its rounds)
    assert mean_nll(model, examples, 8, "pad_noise", seed=3)[0] == mean_nll(model, examples, 8)[0]
    names = STUDY.reported_metrics(config)
    assert ("damage_pair_break" in names) == encoder.startswith("butterfly")
    assert ("damage_detail_shuffle" in names) == (reader != "mha")
    assert ("stop_mass_depth_0" in names) == (reader != "mha")
    clean = mean_nll(model, examples, 8)[0]
    for intervention in applicable_interventions("factorial", encoder, reader):
        assert mean_nll(model, examples, 8, intervention, seed=1)[0] != clean, intervention
    optimizer, losses = torch.optim.AdamW(model.parameters(), lr=1e-2), []
    for _ in range(5):
        optimizer.zero_grad()
        loss, n = token_nll(model(batch))
        (loss / n).backward()
        optimizer.step()
        losses.append(float(loss.detach() / n))
    assert losses[-1] < losses[0]
    parts = parameter_parts(model)
    assert sum(STUDY.parameter_parts(config).values()) == STUDY.param_count(config)
    assert parts["decoder"] == parameter_parts(Translator(_tiny("lifting"), 20))["decoder"]
    assert forward_flops(config, 20) > forward_flops(_tiny("target_only"), 20)


def test_the_cell_must_be_named_and_fit():
    with pytest.raises(ValidationError, match="needs both"):
        TranslatorConfig(arm="factorial", encoder="bigru")
    with pytest.raises(ValidationError, match="fixes its own"):
        TranslatorConfig(arm="lifting", reader="mha")
    with pytest.raises(ValidationError):
        TranslatorConfig(arm="factorial", encoder="rnn", reader="mha")
    with pytest.raises(ValidationError, match="heads"):
        TranslatorConfig(arm="factorial", encoder="butterfly", reader="mha", read_dim=30)
    TranslatorConfig(arm="factorial", encoder="butterfly", reader="lifting", read_dim=30)


def test_relay_differs_from_the_butterfly_only_on_short_sequences():
    """The same weights: on sentences filling all N leaves the relaying Butterfly computes exactly what
    the Butterfly does; on shorter ones some occupied leaf hears an empty leaf's relay."""
    torch.manual_seed(0)
    plain = Translator(_cell("butterfly", "lifting"), 20)
    _randomise(plain)
    relay = Translator(_cell("butterfly_relay", "lifting"), 20)
    relay.load_state_dict(plain.state_dict())
    n = plain.config.n_leaves
    src = torch.randint(5, 20, (4, n))
    full = torch.ones(4, n, dtype=torch.bool)
    for model in (plain, relay):
        model.eval()
    a, b = plain.encode(src, full), relay.encode(src, full)
    assert torch.equal(a["states"][-1], b["states"][-1]) and torch.equal(a["h0"], b["h0"])
    short = torch.arange(n).unsqueeze(0) < torch.tensor([[3], [5], [6], [7]])
    src = src.masked_fill(~short, PAD)
    a, b = plain.encode(src, short), relay.encode(src, short)
    assert not torch.allclose(a["states"][-1][short], b["states"][-1][short])
    assert (a["states"][-1][~short] == 0).all() and (b["states"][-1][~short] == 0).all()


# ------------------------------------------------------------------------------------ the draft's sizes
# The draft contract's settings (issue #31): every cell's encoder width sized by `matched_width` to the
# reference cell, transformer2 under the lifting reader with ffn_hidden = 2 d_model (v2's d_model, hidden, read_dim).
DRAFT = dict(depth=4, d_model=64, hidden=64, read_dim=32, heads=4, vocab_size=4000)
REFERENCE = {"arm": "factorial", "encoder": "transformer2", "reader": "lifting", "ffn_hidden": 128}
DRAFT_WIDTHS = {  # encoder + reader parameters vs the reference's 97,472
    ("butterfly", "lifting"): 263,  # 97,362
    ("butterfly", "all_nodes"): 263,
    ("butterfly", "mha"): 313,  # 97,526
    ("butterfly_relay", "lifting"): 263,
    ("butterfly_relay", "all_nodes"): 263,
    ("butterfly_relay", "mha"): 313,
    ("bigru", "lifting"): 71,  # 97,914
    ("bigru", "all_nodes"): 71,
    ("bigru", "mha"): 80,  # 98,048
    ("transformer2", "lifting"): 128,  # the reference
    ("transformer2", "all_nodes"): 128,
    ("transformer2", "mha"): 177,  # 97,378
}


def test_cells_match_encoder_and_reader_within_five_percent_at_the_draft_sizes():
    reference = STUDY.parameter_parts(TranslatorConfig(**DRAFT, **REFERENCE))
    for (encoder, reader), width in DRAFT_WIDTHS.items():
        config = TranslatorConfig(
            arm="factorial",
            encoder=encoder,
            reader=reader,
            **DRAFT,
            **{WIDTH_OF_ENCODER[encoder]: width},
        )
        assert matched_width(config, REFERENCE) == width, (encoder, reader)
        parts = STUDY.parameter_parts(config)
        assert abs(parts["encoder_reader"] / reference["encoder_reader"] - 1) <= 0.05
        assert parts["embeddings"] == reference["embeddings"]
        assert parts["decoder"] == reference["decoder"]


# ------------------------------------------------------------------------------------ existing arms
V2 = ROOT / "contracts" / "treeheap-vs-dense-v2.yaml"


def test_existing_contract_configs_still_validate():
    for path in sorted((ROOT / "contracts").glob("treeheap-*.yaml")):
        for name, config in yaml.safe_load(path.read_text())["arms"].items():
            if config["arm"] == "factorial":  # a cell names its encoder and reader
                continue
            parsed = TranslatorConfig(**config)
            assert parsed.encoder is None and parsed.reader is None, (path.name, name)


# 5 AdamW steps (lr 1e-2, torch.manual_seed(3)) on the eight toy pairs, computed by the code before
# the factorial existed (git 70aa0ba)
BEFORE = {
    "lifting": [3.166247606277466, 2.590599298477173, 2.2681422233581543],
    "bahdanau": [2.9922423362731934, 2.7190041542053223, 2.443044424057007],
    "all_nodes": [3.052246332168579, 2.6296069622039795, 2.3223717212677],
}


@pytest.mark.parametrize("arm", sorted(BEFORE))
def test_existing_arms_give_the_numbers_they_gave_before(arm):
    torch.manual_seed(3)
    model = Translator(_tiny(arm), 20)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch, run = collate(_toy_examples(8), 8), []
    for _ in range(3):
        optimizer.zero_grad()
        loss, n = token_nll(model(batch))
        (loss / n).backward()
        optimizer.step()
        run.append(float(loss.detach() / n))
    assert run == pytest.approx(BEFORE[arm], rel=1e-5, abs=1e-6)
