"""The dense query-key teacher: split, tokenizer+model cache, determinism, causality, record()."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from gates.models.common import in_train_slice, split_lines
from gates.models.teacher import TeacherConfig, load_or_train, read_complete, teacher_key

# tiny but real: trains in about a second on one core
TINY = dict(
    vocab_size=200,
    d_model=32,
    d_k=32,
    layers=2,
    seq_len=32,
    max_positions=64,
    batch=8,
    steps=30,
    lr=3e-3,
)


def grammar_lines(seed: int, count: int) -> list[str]:
    """English-like sentences from a small grammar (one to three per line)."""
    rng = random.Random(seed)
    subjects = [
        "the user",
        "a window",
        "the dialog",
        "this option",
        "the cell",
        "every chart",
        "the toolbar",
        "a macro",
        "the document",
        "each table",
        "the printer",
        "a style",
    ]
    verbs = [
        "opens",
        "closes",
        "selects",
        "formats",
        "inserts",
        "deletes",
        "exports",
        "sorts",
        "hides",
        "shows",
        "saves",
        "prints",
        "checks",
        "updates",
    ]
    objects = [
        "the file",
        "a new sheet",
        "the selected text",
        "all rows",
        "the current page",
        "a hyperlink",
        "the default settings",
        "the chart title",
        "hidden columns",
        "the index entry",
        "a template",
        "the paragraph style",
    ]
    endings = [
        "",
        " automatically",
        " when you click OK",
        " from the Format menu",
        " in the sidebar",
        " before printing",
        " for the whole document",
    ]
    lines = []
    for _ in range(count):
        sentences = [
            f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}"
            f"{rng.choice(endings)}."
            for _ in range(rng.randint(1, 3))
        ]
        lines.append(" ".join(s[0].upper() + s[1:] for s in sentences))
    return lines


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "grammar.txt"
    path.write_text("\n".join(grammar_lines(0, 700)) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh, empty teacher cache for one test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TREEHEAP_GATES_CACHE", str(root))
    return root


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """One tiny teacher trained into its own cache (shared by the read-only tests below)."""
    root = tmp_path_factory.mktemp("trained-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TREEHEAP_GATES_CACHE", str(root))
        messages: list[str] = []
        torch.manual_seed(123)
        teacher = load_or_train(TeacherConfig(corpus=str(corpus), **TINY), log=messages.append)
        after_training = torch.rand(4)
        yield teacher, root, messages, after_training


# ------------------------------------------------------------------------------------ config
def test_config_is_strict_and_checks_its_ranges():
    with pytest.raises(ValidationError):
        TeacherConfig(d_k=16)  # studies.md: d_k 32-64
    with pytest.raises(ValidationError):
        TeacherConfig(layers=3)
    with pytest.raises(ValidationError):
        TeacherConfig(seq_len=128, max_positions=64)
    with pytest.raises(ValidationError):
        TeacherConfig(heads=2)  # unknown field
    with pytest.raises(ValidationError):
        TeacherConfig().steps = 10  # frozen


# ------------------------------------------------------------------------------------ split
def test_split_is_disjoint_complete_and_independent_of_line_order():
    lines = grammar_lines(1, 600) + ["", "   "]
    train, heldout = split_lines(lines, 0.9)
    assert set(train).isdisjoint(heldout)
    assert set(train) | set(heldout) == {line for line in lines if line.strip()}
    assert 0.8 < len(train) / (len(train) + len(heldout)) < 0.97
    assert train == [line for line in lines if line in set(train)]  # corpus order kept

    shuffled = list(lines)
    random.Random(7).shuffle(shuffled)
    train2, heldout2 = split_lines(shuffled, 0.9)
    assert sorted(train2) == sorted(train) and sorted(heldout2) == sorted(heldout)

    # a line's side depends on its text alone, so duplicates never straddle the split
    duplicated = split_lines(lines + lines[:50], 0.9)
    assert set(duplicated[0]).isdisjoint(duplicated[1])
    assert all(in_train_slice(line, 0.9) == (line in set(train)) for line in lines if line.strip())
    # a larger fraction only moves lines from held-out into train
    assert set(train) <= set(split_lines(lines, 0.95)[0])


# ------------------------------------------------------------------------------------ cache
def test_training_writes_a_complete_entry_and_the_second_call_loads_it(trained, corpus):
    teacher, root, messages, after_training = trained
    assert teacher.trained_now
    assert any("step 30/30" in message for message in messages)  # it really trained
    folder = root / "teachers" / teacher.key
    assert teacher.directory == folder
    assert {"tokenizer.model", "weights.pt", "teacher.json"} <= {p.name for p in folder.iterdir()}
    assert not list((root / "teachers").glob(".tmp-*"))  # no temp folders left behind

    meta = json.loads((folder / "teacher.json").read_text())
    assert meta["key"] == teacher.key and meta["config"] == teacher.config.model_dump(mode="json")
    for name in (
        "final_train_loss",
        "heldout_loss",
        "heldout_perplexity",
        "train_seconds",
        "train_tokens",
        "heldout_tokens",
        "train_lines",
        "heldout_lines",
    ):
        assert meta[name] > 0, name
    assert meta["vocab_size_actual"] <= 200
    assert not teacher.model.training
    assert not any(p.requires_grad for p in teacher.model.parameters())

    # training did not move the caller's random stream
    torch.manual_seed(123)
    assert torch.equal(after_training, torch.rand(4))

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TREEHEAP_GATES_CACHE", str(root))
        again_log: list[str] = []
        again = load_or_train(TeacherConfig(corpus=str(corpus), **TINY), log=again_log.append)
    assert not again.trained_now and again.key == teacher.key
    assert not any("step" in message for message in again_log)
    assert again.meta == teacher.meta
    for name, tensor in teacher.model.state_dict().items():
        assert torch.equal(tensor, again.model.state_dict()[name]), name


def test_partial_entry_is_retrained_and_training_is_deterministic(trained, corpus, cache):
    teacher, _, _, _ = trained
    # a killed trainer's leftovers under the final name: everything but the commit point
    partial = cache / "teachers" / teacher.key
    shutil.copytree(teacher.directory, partial)
    (partial / "teacher.json").unlink()
    stale = cache / "teachers" / f".tmp-{teacher.key}-deadbeef"
    stale.mkdir()
    assert read_complete(partial, teacher.key) is None
    assert read_complete(teacher.directory, "0" * 64) is None  # another key's entry

    rebuilt = load_or_train(teacher.config, log=lambda message: None)
    assert rebuilt.trained_now and rebuilt.directory == partial
    assert read_complete(partial, teacher.key) is not None
    assert not stale.exists()

    # same config, trained again from nothing: bit-identical tokenizer, weights and recordings
    assert (partial / "tokenizer.model").read_bytes() == (
        teacher.directory / "tokenizer.model"
    ).read_bytes()
    for name, tensor in teacher.model.state_dict().items():
        assert torch.equal(tensor, rebuilt.model.state_dict()[name]), name
    q1, k1 = teacher.record("heldout", 4, 48)
    q2, k2 = rebuilt.record("heldout", 4, 48)
    assert torch.equal(q1, q2) and torch.equal(k1, k2)


def test_cache_key_follows_corpus_config_and_not_call_order(corpus, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("\n".join(grammar_lines(2, 700)) + "\n", encoding="utf-8")
    base = TeacherConfig(corpus=str(corpus), **TINY)
    assert teacher_key(base) == teacher_key(TeacherConfig(corpus=str(corpus), **TINY))
    assert teacher_key(base) != teacher_key(base.model_copy(update={"corpus": str(other)}))
    assert teacher_key(base) != teacher_key(
        TeacherConfig(corpus=str(corpus), **{**TINY, "seed": 1})
    )
    assert len(teacher_key(base)) == 64


# ------------------------------------------------------------------------------------ record
def test_record_shapes_windows_and_errors(trained):
    teacher, _, _, _ = trained
    queries, keys = teacher.record("train", 6, 64)
    assert queries.shape == keys.shape == (6, 64, 32)
    assert queries.dtype == keys.dtype == torch.float32
    assert torch.isfinite(queries).all() and not torch.equal(queries, keys)

    # record() is the teacher run on consecutive non-overlapping windows of the split's stream
    stream = teacher.stream("train")
    direct_q, direct_k = teacher.queries_keys(stream[: 6 * 64].view(6, 64))
    assert torch.equal(direct_q, queries) and torch.equal(direct_k, keys)
    assert not torch.equal(teacher.record("heldout", 6, 64)[0], queries)  # the other split

    # a second call is served from the recording cache, identically
    assert (teacher.directory / "records" / "train-6x64.pt").is_file()
    again_q, again_k = teacher.record("train", 6, 64)
    assert torch.equal(again_q, queries) and torch.equal(again_k, keys)

    with pytest.raises(ValueError, match="max_positions"):
        teacher.record("train", 1, 65)
    with pytest.raises(ValueError, match="split"):
        teacher.record("test", 1, 16)
    available = len(teacher.stream("heldout")) // 64
    with pytest.raises(ValueError, match=f"only {available} windows"):
        teacher.record("heldout", available + 1, 64)


def test_another_layer_is_recorded_apart_and_is_that_block_s_own_projection(trained):
    """record(..., layer) gives block `layer`'s queries and keys (its own projections of its own input),
    cached apart from the last layer's; None and the last index are the same recording."""
    teacher, _, _, _ = trained
    last_q, last_k = teacher.record("train", 3, 64)
    assert all(
        torch.equal(a, b) for a, b in zip(teacher.record("train", 3, 64, layer=1), (last_q, last_k))
    )
    first_q, first_k = teacher.record("train", 3, 64, layer=0)
    assert (teacher.directory / "records" / "train-3x64-layer0.pt").is_file()
    assert not (teacher.directory / "records" / "train-3x64-layer1.pt").exists()
    assert first_q.shape == last_q.shape and not torch.allclose(first_q, last_q)

    tokens = teacher.stream("train")[: 3 * 64].view(3, 64)
    block = teacher.model.blocks[0]
    with torch.no_grad():
        x = block.attention_norm(teacher.model.embed(tokens))
        assert torch.equal(first_q, block.attention.W_Q(x)) and torch.equal(
            first_k, block.attention.W_K(x)
        )
    for bad in (2, -1):
        with pytest.raises(ValueError, match="layers 0..1"):
            teacher.record("train", 3, 64, layer=bad)


def test_queries_and_keys_are_causal(trained):
    teacher, _, _, _ = trained
    tokens = teacher.stream("heldout")[:64].clone()[None, :]
    t = 20
    changed = tokens.clone()
    changed[0, t + 1 :] = torch.randint(
        3, teacher.tokenizer.get_piece_size(), (63 - t,), generator=torch.Generator().manual_seed(0)
    )
    q, k = teacher.queries_keys(tokens)
    q2, k2 = teacher.queries_keys(changed)
    assert torch.equal(q[:, : t + 1], q2[:, : t + 1]) and torch.equal(k[:, : t + 1], k2[:, : t + 1])
    assert not torch.allclose(
        q[:, t + 1 :], q2[:, t + 1 :]
    )  # the change reached the later positions
    # changing an earlier token does move position t (attention really looks back)
    earlier = tokens.clone()
    earlier[0, 5] = (earlier[0, 5] + 1) % teacher.tokenizer.get_piece_size()
    assert not torch.allclose(q[0, t], teacher.queries_keys(earlier)[0][0, t])


# ------------------------------------------------------------------------------------ device
def test_the_key_is_the_one_from_before_devices(corpus):
    """A teacher is trained on the CPU whatever the arm's device: the key has no device, cached teachers
    stay valid (only recordings made on cuda are kept apart, by file name)."""
    import hashlib

    from gates.models.corpora import source_fingerprint
    from gates.models.teacher import TEACHER_VERSION

    config = TeacherConfig(corpus=str(corpus), **TINY)
    identity = {
        "source_fingerprint": source_fingerprint(config.corpus),
        "config": config.model_dump(mode="json"),
        "teacher_version": TEACHER_VERSION,
    }
    before = hashlib.sha256(
        json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    assert teacher_key(config) == before


@pytest.mark.parametrize("device", ["auto", "gpu", "cuda:0"])
def test_load_or_train_takes_a_resolved_device_only(corpus, cache, device):
    with pytest.raises(ValueError, match="resolve"):
        load_or_train(TeacherConfig(corpus=str(corpus), **TINY), log=lambda _: None, device=device)


def test_recordings_are_on_the_cpu_and_kept_apart_per_device(trained):
    import dataclasses

    teacher, _, _, _ = trained
    assert teacher.device == "cpu" and teacher.meta.get("device") == "cpu"
    queries, keys = teacher.record("train", 2, 16)
    assert queries.device.type == "cpu" and keys.device.type == "cpu"
    assert (teacher.directory / "records" / "train-2x16.pt").is_file()
    # a cuda teacher (the same weights) reads and writes its own recordings: planted here, it reads them
    planted = {"queries": torch.zeros(2, 16, 32), "keys": torch.ones(2, 16, 32)}
    torch.save(planted, teacher.directory / "records" / "train-2x16-cuda.pt")
    on_cuda = dataclasses.replace(teacher, device="cuda")
    cuda_queries, cuda_keys = on_cuda.record("train", 2, 16)
    assert torch.equal(cuda_queries, planted["queries"]) and torch.equal(cuda_keys, planted["keys"])
    assert torch.equal(teacher.record("train", 2, 16)[0], queries)  # the CPU's untouched
    (teacher.directory / "records" / "train-2x16-cuda.pt").unlink()


# ------------------------------------------------------------------------------------ the optimised step
def _old_attention(self, x):
    """CausalSelfAttention.forward before #12: a new mask per call and an out-of-place masked copy."""
    import math

    q, k = self.queries_keys(x)
    T = x.shape[1]
    scores = q @ k.transpose(1, 2) / math.sqrt(self.d_k)
    future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
    attention = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return self.W_O(attention @ self.W_V(x))


def _old_windows(stream, rows, length, generator):
    """sample_windows before #12: an index tensor per step."""
    starts = torch.randint(0, len(stream) - length, (rows,), generator=generator)
    windows = stream[starts[:, None] + torch.arange(length + 1)[None, :]]
    return windows[:, :-1], windows[:, 1:]


def test_training_equals_the_previous_implementation_bit_for_bit(monkeypatch):
    """Cached teachers stay what this code would train: the same losses and weights, to the bit."""
    import gates.models.teacher as teacher_module
    from gates.models.teacher import CausalSelfAttention, TeacherLM, train_teacher

    config = TeacherConfig(**{**TINY, "steps": 6})
    stream = torch.randint(0, 200, (5000,), generator=torch.Generator().manual_seed(0))

    def train(old: bool) -> tuple[float, dict]:
        with monkeypatch.context() as patch:
            if old:
                patch.setattr(CausalSelfAttention, "forward", _old_attention)
                patch.setattr(teacher_module, "sample_windows", _old_windows)
            torch.manual_seed(0)
            model = TeacherLM(config, 200)
            loss = train_teacher(config, model, stream, log=lambda _: None)
            return loss, model.state_dict()

    (old_loss, old_weights), (new_loss, new_weights) = train(old=True), train(old=False)
    assert new_loss == old_loss
    for name, tensor in old_weights.items():
        assert torch.equal(tensor, new_weights[name]), name
