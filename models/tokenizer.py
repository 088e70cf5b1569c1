"""One SentencePiece trainer for the studies that need an exact-size vocabulary (bif_lm, translator)."""

from __future__ import annotations

import io

import numpy as np


def train_sentencepiece(
    lines: list[str],
    vocab_size: int,
    *,
    user_symbols: tuple[str, ...] = (),
    unk_id: int = 0,
    eos_id: int = 1,
    bos_id: int = -1,
    pad_id: int = -1,
) -> bytes:
    """A SentencePiece unigram model (serialized) with exactly vocab_size pieces, trained on `lines`.

    Deterministic: one thread (multi-threaded EM may sum in another order), every line in the
    given order (input_sentence_size 0 = no sampling; no shuffling). A corpus too small for
    vocab_size pieces is an error, so the model's table size is always the config's vocab_size.
    `user_symbols` become single pieces (e.g. direction tokens) right after the special ids.
    """
    import sentencepiece as spm

    model = io.BytesIO()
    longest = max(len(line.encode("utf-8")) for line in lines)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            model_type="unigram",
            vocab_size=vocab_size,
            num_threads=1,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            max_sentence_length=max(4192, longest + 1),  # longer lines would be skipped silently
            bos_id=bos_id,
            eos_id=eos_id,
            unk_id=unk_id,
            pad_id=pad_id,
            user_defined_symbols=list(user_symbols),
            minloglevel=2,
        )
    except (
        RuntimeError
    ) as exc:  # e.g. "Vocabulary size too high (8000). Please set it to a value <= 900."
        raise ValueError(
            f"SentencePiece cannot build {vocab_size} pieces from {len(lines)} training lines: "
            f"{str(exc).split('] ')[-1]}; expected a larger corpus or a smaller vocab_size"
        ) from None
    return model.getvalue()


def encode_stream(tokenizer, lines: list[str]) -> np.ndarray:
    """One token stream: each line's pieces then EOS, concatenated (int64)."""
    eos = tokenizer.eos_id()
    stream: list[int] = []
    for ids in tokenizer.encode(lines):
        stream.extend(ids)
        stream.append(eos)
    return np.asarray(stream, dtype=np.int64)
