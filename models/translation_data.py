"""Parallel text for the translator: pairs in, tokenized examples in both directions out.

- Pairs come from `gates.data.load_pairs` (the LibreOffice help zh-en pairs, or a user's TSV or
  Moses-style files), columns named by `languages` (e.g. ("zh", "en")).
- Deduplicated by source text (the first column; the first pair wins), then split train / valid /
  test by a hash of that text alone: sha1(text)[:8] / 2^64 < test_fraction -> test, next
  valid_fraction -> valid, else train. Stable across runs, machines and corpus order, and both
  directions of one pair always land in the same split.
- SentencePiece (unigram, exactly vocab_size pieces) is trained on the training split's two sides
  only; ids: PAD 0, UNK 1, EOS 2, then one direction token per direction (e.g. <zh2en>, <en2zh>).
  Cached by (corpus fingerprint, settings) under <cache>/translator-tokenizers/<key>/.
- A pair is kept when both sides have 1..max_pieces pieces, so that every example fits: the
  source is [direction] + pieces + [EOS] in at most max_pieces + 2 leaves, the target pieces + [EOS].
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from gates.models.common import text_fraction

DATA_VERSION = 1
PAD, UNK, EOS = 0, 1, 2
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Example:
    direction: str  # e.g. "zh2en"
    src_ids: tuple[int, ...]  # [direction token] + source pieces + [EOS]
    tgt_ids: tuple[int, ...]  # target pieces + [EOS]
    src_text: str
    tgt_text: str


@dataclass
class TranslationData:
    tokenizer: object  # sentencepiece.SentencePieceProcessor
    direction_ids: dict[str, int]
    target_language: dict[str, str]  # direction -> language of its targets
    splits: dict[str, list[Example]]
    meta: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_piece_size()

    def decode(self, ids) -> str:
        return self.tokenizer.decode(
            [i for i in ids if i > EOS and i not in self.direction_ids.values()]
        )


def split_of(source_text: str, valid_fraction: float, test_fraction: float) -> str:
    bucket = text_fraction(source_text)
    if bucket < test_fraction:
        return "test"
    return "valid" if bucket < test_fraction + valid_fraction else "train"


def directions_of(languages: tuple[str, str]) -> tuple[str, str]:
    first, second = languages
    return f"{first}2{second}", f"{second}2{first}"


def _tokenizer(corpus: str, train_pairs: list[tuple[str, str]], settings: dict, log) -> object:
    import sentencepiece as spm

    from gates.models.corpora import cache_root, source_fingerprint
    from gates.models.tokenizer import train_sentencepiece

    key = hashlib.sha256(
        json.dumps({"source": source_fingerprint(corpus), **settings}, sort_keys=True).encode()
    ).hexdigest()
    folder = cache_root() / "translator-tokenizers" / key
    model_file = folder / "tokenizer.model"
    if not model_file.exists():
        log(
            f"training a {settings['vocab_size']}-piece tokenizer on {len(train_pairs)} training pairs of {corpus}"
        )
        lines = [side for pair in train_pairs for side in pair]
        model = train_sentencepiece(
            lines,
            settings["vocab_size"],
            user_symbols=tuple(settings["symbols"]),
            pad_id=PAD,
            unk_id=UNK,
            eos_id=EOS,
        )
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tokenizer.{uuid.uuid4().hex}.tmp"
        tmp.write_bytes(model)
        (folder / "settings.json").write_text(
            json.dumps({"corpus": corpus, **settings}, indent=2) + "\n"
        )
        os.replace(tmp, model_file)  # atomic: a reader sees the whole model or none
    return spm.SentencePieceProcessor(model_file=str(model_file))


@lru_cache(maxsize=4)
def load_translation_data(
    corpus: str,
    languages: tuple[str, str],
    directions: tuple[str, ...],
    vocab_size: int,
    max_pieces: int,
    valid_fraction: float,
    test_fraction: float,
    log=lambda _msg: None,
) -> TranslationData:
    from gates.models.corpora import load_pairs

    unique: dict[str, str] = {}
    for source, target in load_pairs(corpus):
        source, target = source.strip(), target.strip()
        if source and target:
            unique.setdefault(source, target)
    by_split: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    for source, target in unique.items():
        by_split[split_of(source, valid_fraction, test_fraction)].append((source, target))

    all_directions = directions_of(languages)
    symbols = [f"<{d}>" for d in all_directions]
    settings = {
        "vocab_size": vocab_size,
        "symbols": symbols,
        "languages": list(languages),
        "valid_fraction": valid_fraction,
        "test_fraction": test_fraction,
        "version": DATA_VERSION,
    }
    tokenizer = _tokenizer(corpus, by_split["train"], settings, log)
    direction_ids = {d: tokenizer.piece_to_id(f"<{d}>") for d in all_directions}
    target_language = {all_directions[0]: languages[1], all_directions[1]: languages[0]}

    splits: dict[str, list[Example]] = {}
    kept = {}
    for name, pairs in by_split.items():
        firsts = tokenizer.encode([p[0] for p in pairs])
        seconds = tokenizer.encode([p[1] for p in pairs])
        examples = []
        for (text_a, text_b), ids_a, ids_b in zip(pairs, firsts, seconds):
            if not (1 <= len(ids_a) <= max_pieces and 1 <= len(ids_b) <= max_pieces):
                continue
            sides = {
                all_directions[0]: (text_a, ids_a, text_b, ids_b),
                all_directions[1]: (text_b, ids_b, text_a, ids_a),
            }
            for direction in directions:
                src_text, src, tgt_text, tgt = sides[direction]
                examples.append(
                    Example(
                        direction,
                        (direction_ids[direction], *src, EOS),
                        (*tgt, EOS),
                        src_text,
                        tgt_text,
                    )
                )
        splits[name] = examples
        kept[name] = {"pairs": len(pairs), "examples": len(examples)}
    meta = {"corpus": corpus, "unique_pairs": len(unique), "splits": kept, "tokenizer": settings}
    return TranslationData(tokenizer, direction_ids, target_language, splits, meta)


def collate(examples: list[Example], n_leaves: int) -> dict[str, torch.Tensor]:
    """Tensors for a batch: source leaves (left-packed, PAD after), their mask, the decoder's inputs
    (the direction token, then the target shifted right: teacher forcing) and the targets."""
    batch, longest = len(examples), max(len(e.tgt_ids) for e in examples)
    src = torch.full((batch, n_leaves), PAD, dtype=torch.long)
    tgt_in = torch.full((batch, longest), PAD, dtype=torch.long)
    tgt_out = torch.full((batch, longest), PAD, dtype=torch.long)
    for row, e in enumerate(examples):
        src[row, : len(e.src_ids)] = torch.tensor(e.src_ids)
        tgt_out[row, : len(e.tgt_ids)] = torch.tensor(e.tgt_ids)
        tgt_in[row, 0] = e.src_ids[0]  # the direction token starts the target
        tgt_in[row, 1 : len(e.tgt_ids)] = torch.tensor(e.tgt_ids[:-1])
    return {"src": src, "src_mask": src != PAD, "tgt_in": tgt_in, "tgt_out": tgt_out}
