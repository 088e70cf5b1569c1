"""TreeHeap translator: exact inverses, READ's mass, masking, interventions, data, and real tiny training."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from gates.models.translation_data import (
    EOS,
    PAD,
    Example,
    collate,
    load_translation_data,
    split_of,
)
from gates.models.treeheap import (
    Butterfly,
    Fold,
    NodeAttention,
    Read,
    fold_levels,
    random_pairing,
    unfold_levels,
    xor_pairing,
)
from gates.models.treeheap_translator import (
    DENSE_ARMS,
    Translator,
    TranslatorConfig,
    TranslatorStudy,
    applicable_interventions,
    bleu_chrf,
    learning_rate,
    matched_width,
    mean_nll,
    same_direction_roll,
    token_nll,
    translate,
)
from gates.study import Budget, NullReporter
from tests.helpers import translator_rows

pytestmark = pytest.mark.usefixtures("one_thread")
STUDY = TranslatorStudy()


def _randomise(module: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial weights everywhere (U~ starts at zero; a trained one is not)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.5)


def _mask(lengths: list[int], n: int) -> torch.Tensor:
    return torch.arange(n).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)


# ------------------------------------------------------------------------------------ the parts
def test_xor_pairing_pairs_every_leaf_once_per_round():
    for s, (first, second) in enumerate(xor_pairing(16, 4)):
        assert torch.equal(second, first ^ (1 << s))
        assert sorted(torch.cat([first, second]).tolist()) == list(range(16))


def test_butterfly_inverse_is_exact_in_float64():
    butterfly = Butterfly(8, 16, depth=4).double()
    _randomise(butterfly)
    x = torch.randn(5, 16, 8, dtype=torch.float64)
    mask = _mask([16, 9, 1, 4, 13], 16)
    y = butterfly(x, mask)
    assert (y - x).abs().max() > 0.1  # it does change coordinates
    assert (butterfly.inverse(y, mask) - x).abs().max() < 1e-6
    pairing = random_pairing(16, 4, torch.Generator().manual_seed(1))
    assert (butterfly.inverse(butterfly(x, mask, pairing), mask, pairing) - x).abs().max() < 1e-6


@pytest.mark.parametrize("kind", ["lifting", "bilinear"])
def test_unfold_inverts_lifting_fold_in_float64(kind):
    fold = Fold(8, 16, kind, relation_rank=4).double()
    _randomise(fold)
    leaves = torch.randn(4, 16, 8, dtype=torch.float64)
    mask = _mask([16, 11, 2, 1], 16)
    states, details, masks = fold_levels(fold, leaves, mask)
    assert [s.shape[1] for s in states] == [1, 2, 4, 8, 16] and len(details) == 4
    rebuilt = unfold_levels(fold, states[0], details, masks)
    error = ((rebuilt - leaves) ** 2)[mask].max()
    if kind == "lifting":
        assert error < 1e-10
    else:  # a live relation branch is not invertible by the lifting formulas
        assert error > 1e-3
    if kind == "bilinear":  # ... but with the relation branch zeroed it is the lifting scheme again
        fold.relation_gate = 0.0
        states, details, masks = fold_levels(fold, leaves, mask)
        assert ((unfold_levels(fold, states[0], details, masks) - leaves) ** 2)[mask].max() < 1e-10


def test_lifting_update_starts_as_half_the_detail():
    fold = Fold(8, 16, "lifting")
    d = torch.randn(3, 8)
    assert torch.allclose(fold.U(d), 0.5 * d)


def test_read_conserves_mass_and_never_reaches_padding():
    torch.manual_seed(0)
    depth, d = 4, 8
    read = Read(6, d, 5, depth)
    _randomise(read)
    mask = _mask([16, 7, 1, 2], 16)
    leaves = torch.randn(4, 16, d)
    states, _, masks = fold_levels(Fold(d, 8), leaves, mask)
    keys = read.keys(states, masks)
    h = torch.randn(4, 6) * 3
    context, mass = read(h, keys)
    assert mass.shape == (4, 31)
    assert torch.allclose(mass.sum(-1), torch.ones(4), atol=1e-6)
    assert (mass >= 0).all()
    node_mask = torch.cat(masks, 1)
    assert (mass[~node_mask] == 0).all()  # empty leaves and empty subtrees get exactly nothing
    assert torch.allclose(context, torch.einsum("bn,bnd->bd", mass, keys["nodes"]))
    # a one-piece sentence: all mass ends at the root or on the path down to leaf 0
    on_path = [2**k - 1 for k in range(depth + 1)]
    assert torch.allclose(mass[2, on_path].sum(), torch.tensor(1.0), atol=1e-6)


# ------------------------------------------------------------------------------------ the model
def _toy_examples(
    count: int = 8, vocab: int = 20, n_leaves: int = 8, seed: int = 0
) -> list[Example]:
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for i in range(count):
        direction = "zh2en" if i % 2 == 0 else "en2zh"
        src_len = int(torch.randint(1, n_leaves - 1, (1,), generator=generator))
        tgt_len = int(torch.randint(1, n_leaves - 1, (1,), generator=generator))
        src = torch.randint(5, vocab, (src_len,), generator=generator).tolist()
        tgt = torch.randint(5, vocab, (tgt_len,), generator=generator).tolist()
        token = 3 if direction == "zh2en" else 4
        examples.append(Example(direction, (token, *src, EOS), (*tgt, EOS), f"s{i}", f"t{i}"))
    return examples


def _tiny(arm: str, **kw) -> TranslatorConfig:
    return TranslatorConfig(
        arm=arm,
        depth=3,
        d_model=32,
        hidden=32,
        read_dim=16,
        merge_hidden=21,
        relation_rank=8,
        attn_hidden=32,
        gru_hidden=20,
        ffn_hidden=40,
        batch_size=8,
        **kw,
    )


ARMS = [
    "lifting",
    "mlp",
    "bilinear",
    "root_only",
    "flat_seq",
    "target_only",
    "all_nodes",
    "bahdanau",
    "transformer_enc",
]
NEW_ARMS = ["all_nodes", "bahdanau", "transformer_enc"]  # issue #14


@pytest.mark.parametrize("arm", ARMS)
def test_padding_never_reaches_the_output(arm):
    """Garbage in the padded leaves (pad_noise) changes the NLL by exactly 0 for every arm."""
    torch.manual_seed(0)
    model = Translator(_tiny(arm), 20)
    examples = _toy_examples()
    clean = mean_nll(model, examples, 8)[0]
    noisy = mean_nll(model, examples, 8, "pad_noise", seed=3)[0]
    assert noisy == clean


def _unpacked_nll(model: Translator, batch: dict, src: torch.Tensor | None = None) -> torch.Tensor:
    """The decoder as first written: every sentence stepped to the longest target through torch's
    GRUCell on [E_tgt(y_t), c_t], logits at every position, padding ignored by the loss."""
    src = batch["src"] if src is None else src
    memory = model.encode(src, src != PAD)
    fused, d = model.fused(), model.config.d_model
    h = (
        memory["h0"]
        if "h0" in memory
        else torch.zeros(src.shape[0], d, dtype=model.out.weight.dtype)
    )
    logits = []
    for t in range(batch["tgt_in"].shape[1]):
        query = torch.nn.functional.linear(h, fused.h_weight, fused.h_bias)[:, 3 * d :]
        c, _ = model.context(query, memory)
        h = model.gru(torch.cat([model.tgt_embed(batch["tgt_in"][:, t]), c], -1), h)
        logits.append(model.out(torch.cat([h, c], -1)))
    return torch.nn.functional.cross_entropy(
        torch.stack(logits, 1).flatten(0, 1),
        batch["tgt_out"].flatten(),
        ignore_index=PAD,
        reduction="sum",
    )


@pytest.mark.parametrize("arm", ARMS)
def test_packed_decoder_equals_the_unpacked_one(arm):
    """Sorting by target length, stepping only the sentences still going, the precomputed token half of
    the GRU input and the fused maps of h change neither the loss nor its gradients (in float64, beyond
    rounding)."""
    torch.manual_seed(0)
    model = Translator(_tiny(arm), 20).double()
    _randomise(model)
    batch = collate(_toy_examples(8), 8)
    assert (
        len(set((batch["tgt_out"] != PAD).sum(1).tolist())) > 2
    )  # lengths differ: packing matters
    packed, n = token_nll(model(batch))
    assert n == int((batch["tgt_out"] != PAD).sum())
    packed_grads = torch.autograd.grad(packed, list(model.parameters()), allow_unused=True)
    reference = _unpacked_nll(model, batch)
    reference_grads = torch.autograd.grad(reference, list(model.parameters()), allow_unused=True)
    assert torch.allclose(packed, reference, rtol=1e-10)
    for got, want in zip(packed_grads, reference_grads):
        assert (got is None) == (want is None)
        if got is not None:
            assert torch.allclose(got, want, rtol=1e-8, atol=1e-8)
    if arm != "target_only":  # the source_shuffle permutation follows the rows through the sort
        permutation = same_direction_roll(_toy_examples(8))
        shuffled = token_nll(model(batch, "source_shuffle", permutation))[0]
        assert torch.allclose(
            shuffled, _unpacked_nll(model, batch, src=batch["src"][permutation]), rtol=1e-10
        )


# ------------------------------------------------------------------------------------ the dense baselines (#14)
def test_node_attention_has_reads_parameters_and_never_reads_empty_nodes():
    depth, d, m = 4, 8, 5
    read, attention = Read(6, d, m, depth), NodeAttention(6, d, 2 * m, depth)
    assert sum(p.numel() for p in attention.parameters()) == sum(
        p.numel() for p in read.parameters()
    )
    _randomise(attention)
    mask = _mask([16, 7, 1, 2], 16)
    states, _, masks = fold_levels(Fold(d, 8), torch.randn(4, 16, d), mask)
    keys = attention.keys(states, masks)
    context, weights = attention.read_for(torch.randn(4, 10) * 3, keys)
    assert weights.shape == (4, 31) and context.shape == (4, d)
    assert torch.allclose(weights.sum(-1), torch.ones(4), atol=1e-6)
    assert (weights[~torch.cat(masks, 1)] == 0).all() and (weights[torch.cat(masks, 1)] > 0).all()
    assert torch.allclose(context, torch.einsum("bn,bnd->bd", weights, keys["nodes"]))


@pytest.mark.parametrize("arm", NEW_ARMS)
def test_new_arms_shapes_and_masks(arm):
    """Memory and output shapes; what the reader sees of an empty leaf is exactly nothing."""
    torch.manual_seed(0)
    config = _tiny(arm)
    model = Translator(config, 20)
    _randomise(model)
    examples = _toy_examples(8)
    batch = model.batch(examples)
    memory = model.encode(batch["src"], batch["src_mask"])
    n, d, nodes = config.n_leaves, config.d_model, 2 * config.n_leaves - 1
    if arm == "all_nodes":
        assert (
            memory["read"]["keys"].shape == (8, nodes, 2 * config.read_dim) and "h0" not in memory
        )
    else:
        heads = config.heads
        assert memory["read"]["keys"].shape == (8, heads, n, config.read_dim // heads)
        assert memory["read"]["values"].shape == (8, heads, n, d // heads) and memory[
            "h0"
        ].shape == (8, d)
        # empty leaves: states that are never keys, whatever is written there
        states, summary = model.dense_encode(
            model.src_embed(batch["src"]) + model.positions.weight, batch["src_mask"]
        )
        garbage = torch.where(batch["src_mask"].unsqueeze(-1), states, torch.full_like(states, 1e4))
        query = torch.randn(8, config.read_dim)
        clean, _ = model.read.read_for(query, model.read.keys(states, batch["src_mask"]))
        dirty, _ = model.read.read_for(query, model.read.keys(garbage, batch["src_mask"]))
        assert torch.equal(clean, dirty)
        if arm == "bahdanau":  # packed: each direction stops at the last piece, padding stays zero
            assert (states[~batch["src_mask"]] == 0).all()
            lengths = batch["src_mask"].sum(1)
            alone = model.dense_encode(
                model.src_embed(batch["src"][:1, : lengths[0]])
                + model.positions.weight[: lengths[0]],
                batch["src_mask"][:1, : lengths[0]],
            )
            assert torch.allclose(alone[1], summary[:1], atol=1e-6)
            assert torch.allclose(alone[0], states[:1, : lengths[0]], atol=1e-6)
    decoded = model(batch)
    tokens = int((batch["tgt_out"] != PAD).sum())
    assert decoded.logits.shape == (tokens, 20) and decoded.targets.shape == (tokens,)
    if (
        arm == "all_nodes"
    ):  # attention weight per node, none on empty nodes, stop_mass_depth_k measurable
        assert decoded.masses.shape == (tokens, nodes)
        assert torch.allclose(decoded.masses.sum(-1), torch.ones(tokens), atol=1e-5)
    else:
        assert decoded.masses is None
    assert applicable_interventions(arm) == (
        ("source_shuffle", "pair_break", "detail_shuffle")
        if arm == "all_nodes"
        else ("source_shuffle",)
    )
    clean = mean_nll(model, examples, 8)[0]
    for intervention in applicable_interventions(arm):
        assert mean_nll(model, examples, 8, intervention, seed=1)[0] != clean, intervention


@pytest.mark.parametrize("arm", NEW_ARMS)
def test_new_arms_are_deterministic_and_train(arm):
    """The same seed gives the same model and the same losses; a few steps lower the loss."""
    examples, losses = _toy_examples(8), []
    for _ in range(2):
        torch.manual_seed(3)
        model = Translator(_tiny(arm), 20)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        batch, run = model.batch(examples), []
        for _ in range(5):
            optimizer.zero_grad()
            loss, n = token_nll(model(batch))
            (loss / n).backward()
            optimizer.step()
            run.append(float(loss.detach() / n))
        losses.append(run)
    assert losses[0] == losses[1]
    assert losses[0][-1] < losses[0][0]


def test_heads_must_divide_the_widths():
    with pytest.raises(ValidationError):
        TranslatorConfig(arm="bahdanau", read_dim=30, heads=4)
    TranslatorConfig(arm="lifting", read_dim=30, heads=4)  # an arm without heads does not care


@pytest.mark.parametrize("arm", ARMS)
def test_parameter_parts_sum_to_the_count(arm):
    config = _tiny(arm)
    parts = STUDY.parameter_parts(config)
    assert set(parts) == {"encoder_reader", "embeddings", "decoder"}
    assert sum(parts.values()) == STUDY.param_count(config)
    assert (
        parts["decoder"] == STUDY.parameter_parts(_tiny("lifting"))["decoder"]
    )  # the same decoder everywhere
    if arm == "target_only":
        assert parts["encoder_reader"] == 0


def test_new_arms_match_the_tree_encoder_and_reader_at_the_defaults():
    lifting = STUDY.parameter_parts(TranslatorConfig(arm="lifting"))
    for arm in NEW_ARMS:
        config = TranslatorConfig(arm=arm)
        parts = STUDY.parameter_parts(config)
        assert abs(parts["encoder_reader"] / lifting["encoder_reader"] - 1) < 0.01, arm
        assert (
            parts["embeddings"] == lifting["embeddings"] and parts["decoder"] == lifting["decoder"]
        )
        if arm in DENSE_ARMS:
            assert (
                matched_width(config) == config.gru_hidden
                if arm == "bahdanau"
                else config.ffn_hidden
            )
    assert (
        STUDY.parameter_parts(TranslatorConfig(arm="all_nodes")) == lifting
    )  # exactly, by construction


V2_CONTRACTS = [
    "treeheap-vs-dense-v2",
    "treeheap-recursive-over-root-v2",
    "treeheap-relation-branch-v2",
    "treeheap-fold-variants-v2",
]


@pytest.mark.parametrize("contract", V2_CONTRACTS)
def test_v2_contract_arms_match_encoder_and_reader_within_five_percent(contract):
    """At each v2 contract's own settings: every arm with a source has encoder + reader parameters within
    5% of the tree arm's (Butterfly + FOLD + READ), the dense arms at the width `matched_width` gives,
    and the same embeddings and decoder."""
    import pathlib

    import yaml

    path = pathlib.Path(__file__).resolve().parents[1] / "contracts" / f"{contract}.yaml"
    arms = {
        name: TranslatorConfig(**cfg)
        for name, cfg in yaml.safe_load(path.read_text())["arms"].items()
    }
    tree_name = "lifting" if "lifting" in arms else next(iter(arms))  # relation-branch has one arm
    reference = STUDY.parameter_parts(arms[tree_name])
    for name, config in arms.items():
        parts = STUDY.parameter_parts(config)
        assert parts["decoder"] == reference["decoder"], name
        if config.arm in ("target_only", "root_only"):
            continue  # the floor and the root reader are not capacity-matched comparisons
        if (
            config.arm == "bilinear" and name != tree_name
        ):  # lifting plus the relation branch, as in v1
            assert (
                parts["encoder_reader"] - reference["encoder_reader"]
                == 3 * config.d_model * config.relation_rank
            )
            continue
        assert abs(parts["encoder_reader"] / reference["encoder_reader"] - 1) <= 0.05, (
            name,
            parts,
            reference,
        )
        assert parts["embeddings"] == reference["embeddings"], name
        if config.arm in DENSE_ARMS:
            width = config.gru_hidden if config.arm == "bahdanau" else config.ffn_hidden
            assert width == matched_width(config), name


def test_butterfly_xor_views_equal_the_indexed_xor_pairing():
    butterfly = Butterfly(8, 16, depth=4).double()
    _randomise(butterfly)
    x = torch.randn(5, 16, 8, dtype=torch.float64)
    mask = _mask([16, 9, 1, 4, 13], 16)
    assert torch.allclose(
        butterfly(x, mask), butterfly(x, mask, xor_pairing(16, 4)), rtol=0, atol=1e-12
    )


def test_interventions_change_what_they_should():
    torch.manual_seed(0)
    model = Translator(_tiny("bilinear"), 20)
    _randomise(model)
    examples = _toy_examples()
    clean, depth_mass, _ = mean_nll(model, examples, 8)
    assert depth_mass.shape == (4,) and math.isclose(float(depth_mass.sum()), 1.0, rel_tol=1e-5)
    for intervention in applicable_interventions("bilinear"):
        assert mean_nll(model, examples, 8, intervention, seed=1)[0] != clean, intervention
    assert applicable_interventions("target_only") == ()
    assert "relation_zero" not in applicable_interventions("lifting")


def test_same_direction_roll_never_crosses_directions():
    examples = _toy_examples(7)
    permutation = same_direction_roll(examples)
    for i, j in enumerate(permutation.tolist()):
        assert examples[i].direction == examples[j].direction and i != j


def test_collate_teacher_forcing_layout():
    e = Example("zh2en", (3, 7, 8, EOS), (9, 10, EOS), "a", "b")
    batch = collate([e], 8)
    assert batch["src"].tolist() == [[3, 7, 8, EOS, PAD, PAD, PAD, PAD]]
    assert batch["src_mask"].sum() == 4
    assert batch["tgt_in"].tolist() == [[3, 9, 10]] and batch["tgt_out"].tolist() == [[9, 10, EOS]]


@pytest.mark.parametrize("arm", ["lifting", "flat_seq", *NEW_ARMS])
def test_a_tiny_run_memorises_eight_pairs_and_decodes_them_exactly(arm):
    torch.manual_seed(0)
    examples = _toy_examples(8)
    model = Translator(_tiny(arm), 20)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batch = collate(examples, 8)
    for _ in range(300):
        optimizer.zero_grad()
        loss, n = token_nll(model(batch))
        (loss / n).backward()
        optimizer.step()
    assert float(loss.detach() / n) < 0.01
    targets = [list(e.tgt_ids[:-1]) for e in examples]
    assert translate(model, examples) == targets
    assert translate(model, examples, beam_size=3) == targets


# ------------------------------------------------------------------------------------ data and study
@pytest.fixture
def pair_file(tmp_path):
    """A user's own TSV: real-looking text so that SentencePiece has something to learn."""
    rows = translator_rows()
    rows.append(rows[0].split("\t")[0] + "\tduplicate source, dropped")
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_data_from_a_users_tsv_split_by_source_hash(pair_file, tmp_path, monkeypatch):
    monkeypatch.setenv("TREEHEAP_GATES_CACHE", str(tmp_path / "cache"))
    data = load_translation_data(
        str(pair_file), ("zh", "en"), ("zh2en", "en2zh"), 120, 14, 0.1, 0.1
    )
    assert data.vocab_size == 120 and data.direction_ids == {"zh2en": 3, "en2zh": 4}
    assert (tmp_path / "cache" / "translator-tokenizers").is_dir()
    sources = {
        name: {e.src_text for e in examples if e.direction == "zh2en"}
        for name, examples in data.splits.items()
    }
    assert not sources["train"] & sources["test"] and not sources["train"] & sources["valid"]
    for name, texts in sources.items():
        assert all(split_of(t, 0.1, 0.1) == name for t in texts)
    for e in data.splits["train"]:
        assert e.src_ids[0] == data.direction_ids[e.direction] and e.src_ids[-1] == EOS
        assert len(e.src_ids) <= 16 and e.tgt_ids[-1] == EOS
    assert not any(
        e.tgt_text == "duplicate source, dropped" for s in data.splits.values() for e in s
    )
    both = [e for e in data.splits["test"] if e.direction == "en2zh"]
    assert both and data.target_language == {"zh2en": "en", "en2zh": "zh"}
    assert data.decode(both[0].tgt_ids).replace(" ", "") == both[0].tgt_text.replace(" ", "")


def test_moses_files_give_the_same_data_as_the_tsv(pair_file, tmp_path, monkeypatch):
    """A user's Moses-style parallel files (e.g. a WMT slice): the same pairs, the same examples."""
    monkeypatch.setenv("TREEHEAP_GATES_CACHE", str(tmp_path / "cache"))
    rows = [line.split("\t") for line in pair_file.read_text().splitlines()]
    (tmp_path / "corpus.zh").write_text("\n".join(r[0] for r in rows) + "\n")
    (tmp_path / "corpus.en").write_text("\n".join(r[1] for r in rows) + "\n")
    args = (("zh", "en"), ("zh2en",), 120, 14, 0.1, 0.1)
    from_tsv = load_translation_data(str(pair_file), *args)
    from_moses = load_translation_data(f"moses:{tmp_path / 'corpus'}:zh:en", *args)
    assert from_moses.splits == from_tsv.splits and from_tsv.splits["train"]


def test_bleu_uses_the_chinese_tokenizer_for_chinese_targets():
    score, _, signature, _ = bleu_chrf(["打开文件"], ["打开文件"], "zh")
    assert score == pytest.approx(100.0) and "tok:zh" in signature
    assert "tok:13a" in bleu_chrf(["open the file"], ["open the file"], "en")[2]


def test_config_rejects_unknown_directions():
    with pytest.raises(ValidationError):
        TranslatorConfig(arm="lifting", directions=("de2en",))


def test_flat_seq_is_within_five_percent_of_lifting_at_the_defaults():
    lifting = STUDY.param_count(TranslatorConfig(arm="lifting"))
    for arm in ("flat_seq", "mlp", "bilinear"):
        assert abs(STUDY.param_count(TranslatorConfig(arm=arm)) / lifting - 1) < 0.05, arm


def test_study_run_end_to_end_is_deterministic(pair_file, tmp_path, monkeypatch):
    monkeypatch.setenv("TREEHEAP_GATES_CACHE", str(tmp_path / "cache"))
    config = TranslatorConfig(
        arm="bilinear",
        corpus=str(pair_file),
        vocab_size=120,
        depth=4,
        d_model=16,
        hidden=16,
        read_dim=8,
        merge_hidden=11,
        relation_rank=4,
        batch_size=16,
        valid_examples=32,
        bleu_examples=10,
        samples=2,
        valid_fraction=0.1,
        test_fraction=0.1,
    )
    runs = []
    for _ in range(2):
        reporter = NullReporter(Budget(6, 3))
        attached = {}
        reporter.attach = attached.__setitem__
        runs.append(STUDY.run(config, 0, reporter))
    first, second = runs
    for name in (
        "test_nll",
        "bleu_zh2en",
        "chrf_en2zh",
        "damage_source_shuffle",
        "damage_relation_zero",
        "unfold_mse",
        "stop_mass_depth_0",
        "val_nll",
    ):
        assert name in first and first[name] == second[name], name
    assert [step for step, _ in reporter.history] == [3, 6]
    assert "source:" in attached["samples.txt"] and "BLEU" in attached["samples.txt"]
    assert first["train_tokens_per_s"] > 0


def test_keep_best_measures_the_weights_of_the_lowest_val_nll(pair_file, tmp_path, monkeypatch):
    """Early stopping: the final val_nll is the lowest reported one, the test metrics come from those
    weights (deterministically), and keep_best off leaves a run exactly as it was."""
    monkeypatch.setenv("TREEHEAP_GATES_CACHE", str(tmp_path / "cache"))
    config = TranslatorConfig(
        arm="transformer_enc",
        corpus=str(pair_file),
        vocab_size=120,
        depth=4,
        d_model=16,
        hidden=16,
        read_dim=8,
        gru_hidden=8,
        ffn_hidden=16,
        batch_size=16,
        valid_examples=32,
        bleu_examples=10,
        samples=2,
        valid_fraction=0.1,
        test_fraction=0.1,
        lr=0.3,
        warmup_steps=0,
    )  # a rate at which val_nll jumps about: the best is not the last
    runs = []
    for keep in (True, True, False):
        reporter = NullReporter(Budget(12, 2))
        runs.append(
            (
                STUDY.run(config.model_copy(update={"keep_best": keep}), 0, reporter),
                reporter.history,
            )
        )
    (best, history), (again, _), (plain, plain_history) = runs
    reported = {step: m["val_nll"] for step, m in history}
    assert (
        best["val_nll"] == min(reported.values())
        and reported[int(best["best_val_step"])] == best["val_nll"]
    )
    machine = {"train_tokens_per_s", "peak_mem_mb"}
    assert {k: v for k, v in best.items() if k not in machine} == {
        k: v for k, v in again.items() if k not in machine
    }
    assert [m for _, m in plain_history] == [m for _, m in history]  # the same training either way
    assert "best_val_step" not in plain and plain["val_nll"] == reported[12]
    assert best["best_val_step"] < 12 and best["test_nll"] != plain["test_nll"]


def test_the_learning_rate_schedule_warms_up_then_holds_or_anneals_to_zero():
    """`constant` (the default: every recorded run) holds lr after the warmup; `cosine` falls as a half
    cosine to 0 at the budget's last step, so a fixed budget ends annealed."""
    constant = TranslatorConfig(arm="lifting", lr=0.006, warmup_steps=20)
    cosine = constant.model_copy(update={"lr_schedule": "cosine"})
    for config in (constant, cosine):
        assert learning_rate(config, 10, 5500) == pytest.approx(0.003)  # the warmup, alike
        assert learning_rate(config, 20, 5500) == pytest.approx(0.006)
    assert [learning_rate(constant, s, 5500) for s in (100, 5500)] == [0.006, 0.006]
    assert learning_rate(cosine, 20 + 2740, 5500) == pytest.approx(0.003)  # half way: half the rate
    assert learning_rate(cosine, 5500, 5500) == pytest.approx(0.0, abs=1e-12)
    rates = [learning_rate(cosine, s, 5500) for s in range(20, 5501, 100)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))
