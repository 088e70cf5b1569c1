"""TreeHeap translator (seed 001, stage D of seed 000; studies.md section 3).

zh<->en translation through TreeHeap (WRITE, Butterfly, FOLD, READ, GRU) against root-only, dense
and no-source arms. The model (the parts, the arms, the dense baselines and all_nodes, what each
computes): gates.models.treeheap_translator.model. Arm `factorial` (issue #31) crosses an `encoder`
with a `reader` (config fields of those names; `butterfly_hidden` sizes its Butterfly apart from the
fold's `hidden`); each cell reports the metrics of its parts (pair_break with a Butterfly encoder,
detail_shuffle, stop_mass_depth_<k> and unfold_mse with a FOLD reader).

Metrics (test split; NLL in nats per target token, both directions pooled unless suffixed):
test_nll, test_ppl, test_nll_<direction>; bleu_<direction> and chrf_<direction> (sacrebleu corpus
scores of greedy or beam decodes of the first `bleu_examples` test examples of each direction,
tokenize "zh" for Chinese targets, "13a" otherwise; the signatures are saved with the samples),
bleu and chrf (their mean over directions); damage_<intervention> = NLL under the intervention
minus the clean NLL, for the arms it applies to:
  source_shuffle  every example reads the source of another example of the same direction
  pair_break      Butterfly pairs leaves by a random matching each round instead of XOR
  detail_shuffle  every parent is built from another sentence's detail (and the right child it implies)
  relation_zero   the bilinear branch is zeroed (bilinear only)
unfold_mse (leaves rebuilt by UNFOLD from the root and details vs the Butterfly's leaves, lifting-form
folds), stop_mass_depth_<k> (mean READ mass stopped at depth k per target token), val_nll (during
training, on a fixed slice of the valid split), train_tokens_per_s, peak_mem_mb (peak RSS growth
during one training step, from /proc; NaN where the kernel does not offer it). With keep_best every
test metric is measured on the weights of the evaluation with the lowest val_nll (early stopping on the
validation split); the final val_nll is then that lowest one and best_val_step its step.
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace
from typing import ClassVar, Literal

import torch
from pydantic import Field, model_validator

from gates.models.bif_lm import learning_rate as warmup_cosine
from gates.models.common import count_parameters, peak_rss_growth_mb, seed_everything, train_loop
from gates.models.translation_data import (
    Example,
    TranslationData,
    directions_of,
    load_translation_data,
)
from gates.models.treeheap import unfold_levels
from gates.models.treeheap_translator.model import (
    BUTTERFLY_ENCODERS,
    DENSE_ARMS,
    FITS,
    INTERVENTIONS,
    TREE_ARMS,
    TREE_READERS,
    Translator,
    forward_flops,
    parameter_parts,
    token_nll,
    translate,
)
from gates.study import (
    DeviceConfig,
    Metric,
    Reporter,
    Study,
    nonnegative,
    positive,
    proportion,
    resolve_device,
)


class TranslatorConfig(DeviceConfig):
    arm: Literal[
        "lifting",
        "mlp",
        "bilinear",
        "root_only",
        "flat_seq",
        "target_only",
        "all_nodes",
        "bahdanau",
        "transformer_enc",
        "factorial",
    ]
    # arm `factorial` (issue #31): the encoder and the reader named apart, any encoder with any reader
    # it fits (model.FITS); every other arm fixes both and leaves these unset
    encoder: Literal["butterfly", "butterfly_relay", "bigru", "transformer2"] | None = None
    reader: Literal["lifting", "all_nodes", "mha"] | None = None
    corpus: str = "libreoffice-help:zh-en"
    languages: tuple[str, str] = ("zh", "en")  # what the corpus's two columns are
    directions: tuple[str, ...] = ("zh2en", "en2zh")
    vocab_size: int = Field(4000, ge=16)
    depth: int = Field(5, ge=1, le=10)  # N = 2^depth leaves
    d_model: int = Field(128, ge=4)
    hidden: int = Field(128, ge=1)  # Butterfly F, G and the fold's P, U~
    # the Butterfly's F, G width apart from the fold's (sized to match parameters); None = `hidden`
    butterfly_hidden: int | None = Field(None, ge=1)
    read_dim: int = Field(64, ge=1)  # m of READ (and of flat_seq's attention)
    merge_hidden: int = Field(85, ge=1)  # mlp fold: MLP([l, r]) width
    relation_rank: int = Field(32, ge=1)  # bilinear fold
    attn_hidden: int = Field(128, ge=1)  # flat_seq's key MLP width (sized to match parameters)
    heads: int = Field(
        4, ge=1
    )  # bahdanau / transformer_enc: attention heads (divide read_dim and d_model)
    gru_hidden: int = Field(
        73, ge=1
    )  # bahdanau: BiGRU width per direction (sized to match parameters)
    ffn_hidden: int = Field(
        112, ge=1
    )  # transformer_enc: the layer's MLP width (sized to match parameters)
    batch_size: int = Field(64, ge=2)
    lr: float = Field(2e-3, gt=0)
    warmup_steps: int = Field(20, ge=0)
    # after the warmup: `constant` (every recorded run), or `cosine`, a half cosine from lr to 0 at the
    # budget's last step (bif_lm's schedule), so that a fixed budget ends annealed
    lr_schedule: Literal["constant", "cosine"] = "constant"
    clip_grad_norm: float = Field(1.0, gt=0)
    # regularisation (issue #25: something for `tuning` to search besides lr); 0 = none, as every recorded run
    dropout: float = Field(
        0.0, ge=0, lt=1
    )  # on the token embeddings and on the output layer's input, in training
    weight_decay: float = Field(0.0, ge=0)  # AdamW's decoupled weight decay
    valid_fraction: float = Field(0.05, gt=0, lt=0.5)
    test_fraction: float = Field(0.05, gt=0, lt=0.5)
    valid_examples: int = Field(256, ge=2)
    test_examples: int = Field(0, ge=0)  # 0 = the whole test split
    bleu_examples: int = Field(200, ge=1)  # per direction
    beam_size: int = Field(1, ge=1)
    samples: int = Field(20, ge=0)  # sample translations saved per direction
    # measure the weights of the evaluation with the lowest val_nll (early stopping), not the last
    keep_best: bool = False

    @model_validator(mode="after")
    def _directions_known(self) -> TranslatorConfig:
        known = directions_of(self.languages)
        unknown = [d for d in self.directions if d not in known]
        if unknown or not self.directions:
            raise ValueError(
                f"directions {list(self.directions)} must be a non-empty subset of {list(known)}"
            )
        return self

    @model_validator(mode="after")
    def _factorial_cell(self) -> TranslatorConfig:
        if self.arm == "factorial":
            if self.encoder is None or self.reader is None:
                raise ValueError(
                    "arm 'factorial' needs both `encoder` (butterfly, butterfly_relay, bigru, "
                    "transformer2) and `reader` (lifting, all_nodes, mha)"
                )
            if self.reader not in FITS[self.encoder]:
                raise ValueError(
                    f"reader {self.reader!r} does not fit encoder {self.encoder!r} "
                    f"(it fits {list(FITS[self.encoder])})"
                )
        elif self.encoder is not None or self.reader is not None:
            raise ValueError(
                f"`encoder` and `reader` name a cell of arm 'factorial'; arm {self.arm!r} fixes "
                "its own (leave them unset)"
            )
        return self

    @model_validator(mode="after")
    def _heads_divide(self) -> TranslatorConfig:
        uses_heads = self.arm in DENSE_ARMS or (
            self.arm == "factorial" and (self.encoder == "transformer2" or self.reader == "mha")
        )
        if uses_heads and (self.read_dim % self.heads or self.d_model % self.heads):
            raise ValueError(
                f"heads ({self.heads}) must divide read_dim ({self.read_dim}) and d_model ({self.d_model})"
            )
        return self

    @property
    def n_leaves(self) -> int:
        return 2**self.depth


def load_data(config: TranslatorConfig, log=lambda _msg: None) -> TranslationData:
    return load_translation_data(
        config.corpus,
        tuple(config.languages),
        tuple(config.directions),
        config.vocab_size,
        config.n_leaves - 2,
        config.valid_fraction,
        config.test_fraction,
        log=log,
    )


# ------------------------------------------------------------------------------------ measuring
def same_direction_roll(examples: list[Example]) -> torch.Tensor:
    """A permutation sending every example to another example of its own direction (a roll by one
    inside each direction's group; a group of one stays put)."""
    permutation = torch.arange(len(examples))
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        groups.setdefault(e.direction, []).append(i)
    for rows in groups.values():
        permutation[rows] = torch.tensor(rows[1:] + rows[:1])
    return permutation


@torch.no_grad()
def mean_nll(
    model: Translator,
    examples: list[Example],
    batch_size: int,
    intervention: str | None = None,
    seed: int = 0,
) -> tuple[float, torch.Tensor | None, int]:
    """NLL per target token over `examples` (fixed batches, so interventions pair up the same way
    for every model), the mean stopped mass per depth (READ arms, else None) and the token count."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    total, count, depth_mass, mass_tokens = 0.0, 0, None, 0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = model.batch(chunk)
        decoded = model(batch, intervention, same_direction_roll(chunk), generator)
        loss, n = token_nll(decoded)
        total, count = total + float(loss), count + n
        if decoded.masses is not None:
            summed = torch.stack(
                [
                    decoded.masses[:, 2**k - 1 : 2 ** (k + 1) - 1].sum()
                    for k in range(model.config.depth + 1)
                ]
            )
            depth_mass = summed if depth_mass is None else depth_mass + summed
            mass_tokens += n
    model.train()
    return (
        total / max(count, 1),
        (depth_mass / mass_tokens if depth_mass is not None else None),
        count,
    )


def applicable_interventions(
    arm: str, encoder: str | None = None, reader: str | None = None
) -> tuple[str, ...]:
    if arm == "factorial":  # pair_break where there is a Butterfly, detail_shuffle where a FOLD
        return (
            "source_shuffle",
            *(("pair_break",) if encoder in BUTTERFLY_ENCODERS else ()),
            *(("detail_shuffle",) if reader in TREE_READERS else ()),
        )
    if arm == "target_only":
        return ()
    if arm in DENSE_ARMS:
        return ("source_shuffle",)
    if arm == "flat_seq":
        return ("source_shuffle", "pair_break")
    return INTERVENTIONS if arm == "bilinear" else INTERVENTIONS[:3]


@torch.no_grad()
def unfold_mse(model: Translator, examples: list[Example]) -> float:
    batch = model.batch(examples)
    memory = model.encode(batch["src"], batch["src_mask"])
    rebuilt = unfold_levels(
        model.fold, memory["root"].unsqueeze(1), memory["details"], memory["masks"]
    )
    leaves, mask = memory["states"][-1], batch["src_mask"]
    return float(((rebuilt - leaves) ** 2)[mask].mean())


def bleu_chrf(
    hypotheses: list[str], references: list[str], target_language: str
) -> tuple[float, float, str, str]:
    from sacrebleu.metrics import BLEU, CHRF

    bleu = BLEU(tokenize="zh" if target_language == "zh" else "13a")
    chrf = CHRF()
    b, c = bleu.corpus_score(hypotheses, [references]), chrf.corpus_score(hypotheses, [references])
    return b.score, c.score, str(bleu.get_signature()), str(chrf.get_signature())


def learning_rate(config: TranslatorConfig, step: int, total_steps: int) -> float:
    """Linear warmup over warmup_steps, then `lr_schedule`: constant, or cosine to 0 at total_steps."""
    if config.lr_schedule == "cosine":
        shape = SimpleNamespace(lr=config.lr, warmup_steps=config.warmup_steps, min_lr_ratio=0.0)
        return warmup_cosine(shape, step, total_steps)
    return config.lr * min(1.0, step / config.warmup_steps) if config.warmup_steps else config.lr


# ------------------------------------------------------------------------------------ study
class TranslatorStudy(Study):
    """zh<->en translation through TreeHeap (WRITE, Butterfly, FOLD, READ, GRU) vs root-only, dense and no-source."""

    name = "treeheap_translator"
    Config = TranslatorConfig
    # NLLs are nats per target token: positive, on the log scale (a geometric mean; far from 0 with a small
    # seed spread, test_nll 2.70-2.72 for one arm, it differs little from the mean); the NLL differences
    # damage_* can be negative (linear), so their unit is another. unfold_mse and peak_mem_mb stay linear (their
    # reasons below). Throughput is multiplicative: log scale.
    metrics: ClassVar[dict[str, Metric]] = {
        "train_loss": positive("lower", "train", unit="nats"),
        "val_nll": positive("lower", "validation", unit="nats"),
        "test_nll": positive("lower", "test", unit="nats"),
        "test_ppl": Metric("lower", "test", 1.0, None, scale="log"),
        **{f"test_nll_{d}": positive("lower", "test", unit="nats") for d in ("zh2en", "en2zh")},
        "bleu": Metric("higher", "test", 0.0, 100.0),
        "chrf": Metric("higher", "test", 0.0, 100.0),
        **{
            f"{m}_{d}": Metric("higher", "test", 0.0, 100.0)
            for m in ("bleu", "chrf")
            for d in ("zh2en", "en2zh")
        },
        # NLL differences on the test split: no range (an intervention can lower the NLL)
        **{
            f"damage_{i}": Metric("higher", "test", unit="nats (difference)") for i in INTERVENTIONS
        },
        "unfold_mse": nonnegative("lower", "diagnostic", "float rounding (about 3e-14)"),
        **{f"stop_mass_depth_{k}": proportion("higher", "diagnostic") for k in range(11)},
        "train_tokens_per_s": positive("higher", "cost", unit="tokens/s"),
        "peak_mem_mb": nonnegative(
            "lower", "cost", "often exactly 0: a step that does not raise the peak RSS"
        ),
        "best_val_step": nonnegative(
            "higher", "diagnostic"
        ),  # keep_best: the step whose weights were measured
    }
    machine_metrics = frozenset({"train_tokens_per_s", "peak_mem_mb"})
    hyperparameters = frozenset({"lr", "warmup_steps", "clip_grad_norm", "dropout", "weight_decay"})
    # the data (corpus, its columns and directions, the tokenizer, the split, the leaves a sentence must fit
    # in: depth drops longer pairs) and how test weights are chosen (keep_best: the v2 contracts' early stopping)
    regime_fields = (
        "corpus",
        "languages",
        "directions",
        "vocab_size",
        "depth",
        "valid_fraction",
        "test_fraction",
        "valid_examples",
        "test_examples",
        "keep_best",
    )

    def reported_metrics(self, config: TranslatorConfig) -> frozenset[str]:
        """What run() returns for this arm: per-direction NLL, BLEU and chrF for its directions, the damage of
        the interventions that apply to it, READ's (or all_nodes') stopped mass per depth 0..D, unfold_mse for
        the lifting-form folds, best_val_step with keep_best."""
        names = {
            "train_loss",
            "val_nll",
            "test_nll",
            "test_ppl",
            "bleu",
            "chrf",
            "train_tokens_per_s",
            "peak_mem_mb",
        }
        names |= {f"{m}_{d}" for m in ("test_nll", "bleu", "chrf") for d in config.directions}
        names |= {f"damage_{i}" for i in _interventions(config)}
        if config.arm in (*TREE_ARMS, "all_nodes") or config.reader in TREE_READERS:
            names |= {f"stop_mass_depth_{k}" for k in range(config.depth + 1)}
        if _has_unfold(config):
            names.add("unfold_mse")
        if config.keep_best:
            names.add("best_val_step")
        return frozenset(names)

    def chance(self, metric: str, config: TranslatorConfig) -> float | None:
        """A decoder that learned nothing spreads its probability uniformly over the vocab_size pieces (the
        tokenizer has exactly that many): NLL log V nats per token, perplexity V."""
        if metric == "test_ppl":
            return float(self.vocab_size(config))
        if metric in ("train_loss", "val_nll", "test_nll") or metric.startswith("test_nll_"):
            return math.log(self.vocab_size(config))
        return None

    def vocab_size(self, config: TranslatorConfig) -> int:
        return config.vocab_size  # the tokenizer is trained to exactly this size

    def param_count(self, config: TranslatorConfig) -> int:
        return count_parameters(Translator(config, self.vocab_size(config)))

    def parameter_parts(self, config: TranslatorConfig) -> dict[str, int]:
        """Trainable parameters by part (they sum to param_count): see `parameter_parts`."""
        return parameter_parts(Translator(config, self.vocab_size(config)))

    def flops(self, config: TranslatorConfig) -> int:
        return forward_flops(config, self.vocab_size(config))

    def check_ready(self, config: TranslatorConfig) -> str | None:
        from gates.models.corpora import check_source

        return check_source(config.corpus, "pairs")

    def run(self, config: TranslatorConfig, seed: int, reporter: Reporter) -> dict[str, float]:
        data = load_data(config)
        seed_everything(seed)
        model = Translator(config, data.vocab_size).to(resolve_device(config.device))
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        train, valid, test = data.splits["train"], data.splits["valid"], data.splits["test"]
        valid = valid[: config.valid_examples]
        test = test[: config.test_examples] if config.test_examples else test
        generator = torch.Generator().manual_seed(seed)
        counter = {"step": 0, "tokens": 0, "eval_seconds": 0.0}

        def loss_fn() -> torch.Tensor:
            counter["step"] += 1
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(config, counter["step"], reporter.budget.steps)
            rows = torch.randint(len(train), (config.batch_size,), generator=generator).tolist()
            batch = model.batch([train[r] for r in rows])
            loss, n = token_nll(model(batch))
            counter["tokens"] += n
            return loss / n

        best = {"val_nll": math.inf, "state": None, "step": 0}

        def evaluate() -> dict[str, float]:
            started = time.perf_counter()
            val_nll = mean_nll(model, valid, config.batch_size)[0]
            if (
                config.keep_best and val_nll < best["val_nll"]
            ):  # a copy of the weights, kept until a lower one
                best.update(
                    val_nll=val_nll,
                    step=counter["step"],
                    state={k: v.detach().clone() for k, v in model.state_dict().items()},
                )
            counter["eval_seconds"] += time.perf_counter() - started
            return {"val_nll": val_nll}

        started = time.perf_counter()
        last = train_loop(
            model,
            optimizer,
            loss_fn,
            reporter.budget,
            reporter,
            evaluate,
            clip_grad_norm=config.clip_grad_norm,
        )
        train_seconds = time.perf_counter() - started
        if config.keep_best and best["state"] is not None:  # the reported series stays as it was
            model.load_state_dict(best["state"])
            last = {**last, "val_nll": best["val_nll"], "best_val_step": float(best["step"])}
        final = {**last, **self.measure(model, data, test, config, seed, reporter)}
        final["train_tokens_per_s"] = counter["tokens"] / (train_seconds - counter["eval_seconds"])
        final["peak_mem_mb"] = peak_rss_growth_mb(
            lambda: _one_step(model, train, config, generator)
        )
        return final

    def measure(
        self,
        model: Translator,
        data: TranslationData,
        test: list[Example],
        config: TranslatorConfig,
        seed: int,
        reporter: Reporter,
    ) -> dict[str, float]:
        metrics: dict[str, float] = {}
        total, tokens, depth_mass = 0.0, 0, None
        for direction in config.directions:  # pooled over directions, weighted by target tokens
            nll, mass, count = mean_nll(
                model, [e for e in test if e.direction == direction], config.batch_size
            )
            metrics[f"test_nll_{direction}"] = nll
            total, tokens = total + nll * count, tokens + count
            if mass is not None:
                depth_mass = mass * count if depth_mass is None else depth_mass + mass * count
        clean = total / tokens
        metrics["test_nll"], metrics["test_ppl"] = clean, math.exp(min(clean, 50.0))
        depth_mass = depth_mass / tokens if depth_mass is not None else None
        for intervention in _interventions(config):
            metrics[f"damage_{intervention}"] = (
                mean_nll(model, test, config.batch_size, intervention, seed)[0] - clean
            )
        if depth_mass is not None:
            metrics.update({f"stop_mass_depth_{k}": float(v) for k, v in enumerate(depth_mass)})
        if _has_unfold(config):
            metrics["unfold_mse"] = unfold_mse(model, test[:256])

        samples, bleus, chrfs = [], [], []
        for direction in config.directions:
            subset = [e for e in test if e.direction == direction][: config.bleu_examples]
            hypotheses = []
            for start in range(0, len(subset), config.batch_size):
                hypotheses += [
                    data.decode(ids)
                    for ids in translate(
                        model, subset[start : start + config.batch_size], config.beam_size
                    )
                ]
            references = [e.tgt_text for e in subset]
            b, c, b_sig, c_sig = bleu_chrf(hypotheses, references, data.target_language[direction])
            metrics[f"bleu_{direction}"], metrics[f"chrf_{direction}"] = b, c
            bleus.append(b)
            chrfs.append(c)
            samples.append(f"## {direction}: BLEU {b:.2f} ({b_sig}), chrF {c:.2f} ({c_sig})\n")
            for e, hyp in list(zip(subset, hypotheses))[: config.samples]:
                samples.append(
                    f"source:    {e.src_text}\nreference: {e.tgt_text}\noutput:    {hyp}\n"
                )
        metrics["bleu"], metrics["chrf"] = sum(bleus) / len(bleus), sum(chrfs) / len(chrfs)
        attach = getattr(reporter, "attach", None)
        if attach is not None:
            attach("samples.txt", "\n".join(samples))
        return metrics


def _interventions(config: TranslatorConfig) -> tuple[str, ...]:
    return applicable_interventions(config.arm, config.encoder, config.reader)


def _has_unfold(config: TranslatorConfig) -> bool:
    """The lifting-form folds, whose UNFOLD rebuilds the leaves (unfold_mse)."""
    return config.arm in ("lifting", "bilinear", "root_only", "all_nodes") or (
        config.reader in TREE_READERS
    )


def _one_step(model: Translator, train: list[Example], config: TranslatorConfig, generator) -> None:
    rows = torch.randint(len(train), (config.batch_size,), generator=generator).tolist()
    batch = model.batch([train[r] for r in rows])
    loss, n = token_nll(model(batch))
    (loss / n).backward()
    model.zero_grad(set_to_none=True)
