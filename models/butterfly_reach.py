"""Butterfly reach: can every leaf hear every other leaf in log2 N rounds? (seed 001 section 3; issue #15)

The seed's claim (section 3): with N = 2^D leaves, round s pairs address i with j = i XOR 2^s and
couples the pair by b' = b + alpha_s tanh(F(a)), a' = a + alpha_s tanh(G(b')), F and G shared by all
pairs and rounds; N/2 pairs per round, log2 N rounds, "long-distance communication at fixed capacity"
(each leaf keeps d features; no N x N attention). Issue #15 adds the contrasts: adjacent-only coupling
cannot do it in the same number of rounds, and a single root vector is a bottleneck.

Task (one answer per example, at one leaf). N leaves, left-packed: leaves 0 .. L-1 are present, the
rest masked (L = N, or a short length from `short_lengths`). Every present leaf holds a random value
in [0, V) and a role: `filler`, `source` (its value is the answer), `target` (where the answer is
read), or `both` (distance 0: the target answers its own value). Per example a distance delta is drawn
from `distances` (those < L), then a pair (t, s) with |t - s| = delta uniformly over the sequence
(which side the source is on at random). The answer is the source's value: chance is 1/V; the
target's own value and every filler value are drawn independently of it, so nothing but the source
leaf's content gives the answer. Empty leaves hold random values too (role filler): a model that
lets them leak would be hurt, and the tests check they never do.

Arms (the same embeddings and head; the middle differs):
- `butterfly`: `models.treeheap.Butterfly`, the translator's exact module and XOR pairing (a pair with
  an empty member is the identity); the answer is read from the target leaf's final state.
- `adjacent`: the same Butterfly module (same kernel, rounds and parameters) given the pairing
  (2i, 2i+1) in even rounds and (2i+1, 2i+2) in odd ones (no wrap-around: a 1-D chain), through the
  Butterfly's `pairing` argument. In D rounds a leaf hears at most D - 1 to D leaves away.
- `butterfly_relay`: the same Butterfly with empty leaves zeroed and then treated as present, so they
  relay (carry a message through a pair whose other member is padding) but hold no input; the final
  states of empty leaves are never read. A candidate fix for short sequences (see below), not the
  translator's behaviour.
- `root_bottleneck`: no Butterfly; `models.treeheap.Fold` (kind `fold`, default `mlp`: p = MLP([l, r]))
  folded level by level to the root, and the answer read from the root alone.
- `bag_of_leaves`: every leaf sees its own state and the masked mean of all present leaves:
  z_i = x_i + tanh(G(x_i + mean_j tanh(F(x_j)))), F and G of the Butterfly's shapes (full reach, no
  addresses at all).
- `attention` (the load task's upper-bound control): one layer of softmax attention over the present leaves (each leaf
  queries every present leaf; `heads` heads; q, k, v and an output map of width d), then a residual MLP
  of width `hidden`: y = x + O(attn(x)), z = y + MLP(y); the answer is read at the target leaf. Full
  reach and content addressing: the upper-bound control.

Short sequences: with L < N not a power of two, today's Butterfly cuts some (target, source) pairs
off: the only path from s to t crosses at the rounds where their bits differ, and a crossing through
an empty leaf (index >= L) is the identity. `xor_reach` computes which pairs are cut; the study
measures it with gradients on the trained and untrained model.

Metrics. Test sets (their own random stream): `full` (L = N) with `test_examples` per distance, and
`short` (L uniform over `short_lengths`, distances < L) likewise. `accuracy_at_distance_<d>` and
`short_accuracy_at_distance_<d>` per distance; `test_acc`, `short_test_acc` over all; `accuracy_near`
(1 <= d <= D - 1, within the adjacent chain's reach for every target), `accuracy_far` (d > D, beyond
it) and their short variants. Reach, measured: for a target leaf t and present source s, s influences t
when the gradient of the state the head reads at t (the root for `root_bottleneck`) with respect to
s's input embedding is nonzero (norm above 1e-6 of the largest over the sources of that target; two
random projections of the state, so a zero is structural, not an accident); `mean_reach_share` is the
share of present sources that influence a target, averaged over targets and examples, `min_reach_share`
the smallest; `far_reach_share` the share over pairs at distance > D; `short_*` the same on short
sequences (one example per short length). `init_*` are the same on the untrained model (the kernel's
structural reach, measured): what a contract judges reach on, since training teaches a model to
ignore fillers (on butterfly-reach seed 4 two filler influences fell to 4e-7 and 8e-7 of the largest).
A per-leaf table of influencing-source counts is attached to each run (`reach.txt`).

Multi-message task (butterfly-reach-v3; `messages` = M > 1, opt-in, the default 1 is the task above bit
for bit): M disjoint (source, target) pairs per example, pair k marked at both ends by a message id
(an embedding added to the leaf's input), each target's answer its own source's value (`make_messages`),
so M values must be routed at once: the root of width d must hold all M, while the Butterfly's leaves
keep width d each. The root arm then reads z_t = root + tanh(Q([root, x_t])) (the target says which
message it wants). Accuracies pool every message of every test example by its own pair's distance
(near: 1 .. D-1, far: > D). `clip_grad_norm` (default None) clips the gradient norm for every arm.

Load task (issue #31 part 2, for a butterfly-reach-v4 not yet registered: docs/studies.md has its
pilot; `loads` non-empty, opt-in: the defaults leave every earlier config's data, model and metrics
bit for bit): one run trains and tests at several loads M
(e.g. [1, 2, 4, 8]) on full-length sequences. Each training batch draws its M uniformly from `loads`
(one M per batch, so a batch is B x M messages and every load weighs the same in expectation), and
every load has its own test and validation set (natural draws; no distance is forced). M = 1 here is
the id-marked task with one pair, not the single-message task, so the load axis is one task family.
Two routing families (`routing`): `random` (`make_messages`'s draw: 2M distinct random leaves) and
`structured` (`make_structured`: per example one k in 1 .. N-1, every target t reads t XOR k, the M
pairs a random subset of the N/2 pairs {i, i XOR k}, so all M messages follow parallel XOR paths, the
Butterfly's own wiring). In both families every unordered leaf pair is equally likely, so far messages
(> D) are 55% and near ones (1 .. D-1) 35% of every load's messages. Metrics per load M: `test_acc_m<M>`
(every message), `near_acc_m<M>`, `far_acc_m<M>` and `exact_match_m<M>` (examples with all M answers
right; at M = 1 it equals test_acc_m1); `test_acc`, `accuracy_near`, `accuracy_far` and `exact_match`
are their means over the loads; `accuracy_at_distance_<d>` pools every load's messages (reported, not
promised); val_loss / val_acc average the loads' validation sets. The root's read there has width
`read_hidden` (0 = hidden) and the mlp FOLD's P, which its parent never uses, is frozen, so the root
can be parameter-matched to the Butterfly (`merge_hidden`, `read_hidden`).
"""

from __future__ import annotations

import math
import re
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from gates.models.common import count_parameters, seed_everything, train_loop
from gates.models.treeheap import Butterfly, Fold, fold_levels, mlp, xor_pairing
from gates.study import (
    DeviceConfig,
    Metric,
    Reporter,
    Study,
    StudyConfig,
    positive,
    proportion,
    resolve_device,
)

Arm = Literal[
    "butterfly", "adjacent", "butterfly_relay", "root_bottleneck", "bag_of_leaves", "attention"
]
FILLER, SOURCE, TARGET, BOTH = 0, 1, 2, 3
MAX_LEAVES = 32  # depth <= 5: metric names are declared for every distance below it
REACH_TOL = 1e-6  # relative to the largest influence on the same target


class ButterflyReachConfig(DeviceConfig):
    arm: Arm = "butterfly"
    depth: int = Field(4, ge=2, le=5)  # N = 2^depth leaves, depth rounds
    values: int = Field(8, ge=2)  # V: chance is 1/V
    distances: list[int] = Field(default_factory=lambda: [0, 1, 2, 3, 5, 8, 15], min_length=1)
    short_lengths: list[int] = Field(default_factory=lambda: [9, 10, 11, 12, 13, 14, 15])
    short_fraction: float = Field(0.5, ge=0, le=1)  # of training examples
    d_model: int = Field(32, ge=2)
    hidden: int = Field(64, ge=1)  # Butterfly F, G; bag F, G; the fold's P
    merge_hidden: int = Field(0, ge=0)  # root_bottleneck's MLP([l, r]) width (0 = hidden)
    fold: Literal["mlp", "lifting"] = "mlp"  # root_bottleneck's FOLD
    batch_size: int = Field(128, ge=1)
    lr: float = Field(3e-3, gt=0)
    test_examples: int = Field(256, ge=1)  # per distance, per test set
    val_examples: int = Field(512, ge=1)
    # butterfly-reach-v3 (opt-in; the defaults keep v1, v2 and short-reach bit for bit):
    messages: int = Field(
        1, ge=1
    )  # M > 1: M disjoint (source, target) pairs per example, see make_examples
    clip_grad_norm: float | None = Field(None, gt=0)  # gradient-norm clipping, every arm alike
    # the load task (issue #31 part 2; opt-in, the defaults leave every earlier contract bit for bit):
    # several loads in one run, structured (XOR) or random id-matched routing, the attention control
    routing: Literal["random", "structured"] = "random"  # with loads: see make_load
    loads: list[int] = Field(
        default_factory=list
    )  # M per training batch / test set; [] = `messages`
    read_hidden: int = Field(0, ge=0)  # root_bottleneck's read Q width (0 = hidden)
    heads: int = Field(1, ge=1)  # the attention arm's heads (d_model / heads wide each)

    @property
    def n_leaves(self) -> int:
        return 2**self.depth

    @property
    def multi(self) -> bool:
        """Whether examples carry id-marked messages (the multi-message task or the load task)."""
        return self.messages > 1 or bool(self.loads)

    @property
    def n_ids(self) -> int:
        """How many message ids an example can carry (the message embedding has one more row: none)."""
        return max(self.loads) if self.loads else self.messages

    @model_validator(mode="after")
    def _fits(self) -> ButterflyReachConfig:
        n = self.n_leaves
        if any(d < 0 or d >= n for d in self.distances) or len(set(self.distances)) != len(
            self.distances
        ):
            raise ValueError(
                f"distances must be distinct and in [0, {n - 1}] for depth {self.depth}"
            )
        if any(length < 2 or length > n for length in self.short_lengths):
            raise ValueError(f"short_lengths must lie in [2, {n}] for depth {self.depth}")
        if self.short_lengths and not any(d < max(self.short_lengths) for d in self.distances):
            raise ValueError("no distance fits in any short length")
        if self.messages > 1:
            if 2 * self.messages > min([n, *self.short_lengths]):
                raise ValueError(
                    f"{self.messages} disjoint pairs need 2 x {self.messages} present leaves"
                )
            if 0 in self.distances:
                raise ValueError(
                    "with messages > 1 sources and targets are disjoint: no distance 0"
                )
        if self.loads:
            if self.messages != 1:
                raise ValueError("loads sets M per batch: leave messages at 1")
            if self.short_lengths:
                raise ValueError("loads run on full-length sequences only: short_lengths: []")
            if len(set(self.loads)) != len(self.loads) or any(
                m < 1 or 2 * m > n for m in self.loads
            ):
                raise ValueError(
                    f"loads must be distinct and in [1, {n // 2}] for depth {self.depth}"
                )
        elif self.routing != "random":
            raise ValueError("structured routing is a load task: set loads")
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by {self.heads} heads")
        return self


def near_far(config: ButterflyReachConfig) -> tuple[list[int], list[int]]:
    """Distances within every leaf's reach in a D-round adjacent chain (1 .. D-1) and beyond it (> D)."""
    return (
        [d for d in config.distances if 1 <= d <= config.depth - 1],
        [d for d in config.distances if d > config.depth],
    )


# ------------------------------------------------------------------------------------ pairings
def adjacent_pairing(n_leaves: int, rounds: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per round r: (first members, partners) = (2i + r mod 2, 2i + 1 + r mod 2), no wrap-around."""
    return [
        (torch.arange(r % 2, n_leaves - 1, 2), torch.arange(r % 2, n_leaves - 1, 2) + 1)
        for r in range(rounds)
    ]


def pairing_reach(pairing, n_leaves: int, length: int, relay: bool = False) -> torch.Tensor:
    """Structural reach (length x length, bool): [t, s] when leaf s's input can reach leaf t's output
    through the pairs of every round (a pair acts only when both members are present, unless `relay`)."""
    reach = torch.eye(n_leaves, dtype=torch.bool)
    for first, second in pairing:
        act = (
            torch.ones(len(first), dtype=torch.bool)
            if relay
            else (first < length) & (second < length)
        )
        i, j = first[act], second[act]
        merged = reach[i] | reach[j]  # b' hears a; a' hears b' (so both)
        reach[i], reach[j] = merged, merged
    return reach[:length, :length]


def structural_reach(arm: str, depth: int, length: int) -> torch.Tensor:
    """What the pairing alone allows (length x length, bool) for the Butterfly arms; bag_of_leaves,
    root_bottleneck and attention hear every present leaf."""
    n = 2**depth
    if arm in ("bag_of_leaves", "root_bottleneck", "attention"):
        return torch.ones(length, length, dtype=torch.bool)
    pairing = adjacent_pairing(n, depth) if arm == "adjacent" else xor_pairing(n, depth)
    return pairing_reach(pairing, n, length, relay=arm == "butterfly_relay")


# ------------------------------------------------------------------------------------ data
def make_examples(
    config: ButterflyReachConfig,
    generator: torch.Generator,
    count: int,
    lengths: list[int] | None,
    distance: int | None = None,
) -> dict[str, torch.Tensor]:
    """`count` examples. `lengths` None: full length N; else L uniform over `lengths` (those > the
    distance). `distance` None: uniform over the configured distances that fit each example.
    With `messages` > 1: see `make_messages`."""
    if config.messages > 1:
        return make_messages(config, generator, count, lengths, distance)
    n = config.n_leaves
    g = generator
    if lengths is None:
        length = torch.full((count,), n)
    else:
        fit = [length for length in lengths if distance is None or length > distance]
        length = torch.tensor(fit)[torch.randint(len(fit), (count,), generator=g)]
    if distance is None:
        options = torch.tensor(config.distances)
        fits = options[None, :] < length[:, None]  # count x distances
        pick = torch.multinomial(fits.float(), 1, generator=g)[:, 0]
        delta = options[pick]
    else:
        delta = torch.full((count,), distance)
    low = (
        torch.rand(count, generator=g) * (length - delta)
    ).long()  # lower end of the pair, in [0, L - delta)
    source_left = torch.rand(count, generator=g) < 0.5
    source = torch.where(source_left, low, low + delta)
    target = torch.where(source_left, low + delta, low)
    values = torch.randint(config.values, (count, n), generator=g)
    rows = torch.arange(count)
    role = torch.full((count, n), FILLER)
    role[rows, source] = SOURCE
    role[rows, target] = torch.where(source == target, BOTH, TARGET)
    mask = torch.arange(n)[None, :] < length[:, None]
    return {
        "values": values,
        "role": role,
        "mask": mask,
        "target": target,
        "source": source,
        "answer": values[rows, source],
        "distance": delta,
        "length": length,
    }


def make_messages(
    config: ButterflyReachConfig,
    generator: torch.Generator,
    count: int,
    lengths: list[int] | None,
    distance: int | None = None,
    messages: int | None = None,
) -> dict[str, torch.Tensor]:
    """The multi-message task (M = `messages` > 1). M disjoint (source, target) pairs of present leaves
    per example, pair k marked at both ends by a message id (`message`: 0 none, k + 1 for pair k, the
    ids a random permutation per example); every target's answer is its own source's value. `distance`
    None: the 2M leaves are a uniform random draw of distinct present leaves, paired in draw order (so
    the direction and distance of each pair are random: distance d has weight L - d). `distance` d:
    the first pair is placed at distance d (uniformly in the sequence, the source on a random side),
    the other M - 1 as above among the remaining leaves. B x M fields: `target`, `source`, `answer`,
    `distance`; B x N: `values`, `role`, `mask`, `message`; B: `length`. `messages`: M (None: the
    config's `messages`; the load task passes each load's)."""
    n, g = config.n_leaves, generator
    m = config.messages if messages is None else messages
    if lengths is None:
        length = torch.full((count,), n)
    else:
        fit = [length for length in lengths if distance is None or length > distance]
        length = torch.tensor(fit)[torch.randint(len(fit), (count,), generator=g)]
    mask = torch.arange(n)[None, :] < length[:, None]
    # a random order of the present leaves first (absent ones sort last)
    keys = torch.rand(count, n, generator=g) + (~mask).float() * 2
    if distance is not None:
        low = (torch.rand(count, generator=g) * (length - distance)).long()
        source_left = torch.rand(count, generator=g) < 0.5
        first = torch.where(source_left, low, low + distance)
        second = torch.where(source_left, low + distance, low)
        rows = torch.arange(count)
        keys[rows, first], keys[rows, second] = -2.0, -1.0  # drawn first: pair 0
    order = keys.argsort(dim=1)[:, : 2 * m]
    return marked_pairs(config, g, order[:, 0::2], order[:, 1::2], mask, length)


def marked_pairs(
    config: ButterflyReachConfig,
    generator: torch.Generator,
    source: torch.Tensor,
    target: torch.Tensor,
    mask: torch.Tensor,
    length: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Examples of the multi-message tasks from their B x M (source, target) leaves: random values
    at every leaf, then the M message ids (1..M shuffled per example) marking both ends of each pair,
    every other leaf a filler (that order of draws is the recorded contracts')."""
    count, n = mask.shape
    values = torch.randint(config.values, (count, n), generator=generator)
    ids = torch.rand(count, source.shape[1], generator=generator).argsort(dim=1) + 1
    rows = torch.arange(count)[:, None]
    role = torch.full((count, n), FILLER)
    role[rows, source] = SOURCE
    role[rows, target] = TARGET
    message = torch.zeros(count, n, dtype=torch.long)
    message[rows, source] = ids
    message[rows, target] = ids
    return {
        "values": values,
        "role": role,
        "mask": mask,
        "message": message,
        "target": target,
        "source": source,
        "answer": values[rows, source],
        "distance": (target - source).abs(),
        "length": length,
    }


def make_structured(
    config: ButterflyReachConfig, generator: torch.Generator, count: int, messages: int
) -> dict[str, torch.Tensor]:
    """The structured family of the load task: full length N; per example k is
    drawn uniformly from 1 .. N-1, the N/2 leaf pairs {i, i XOR k} are the candidates, M = `messages`
    of them are taken at random and each is oriented at random (which end is the source); both ends
    carry the pair's message id, as in `make_messages` (ids 1..M shuffled per example), every other
    leaf is a filler. So every target t reads t XOR k, and the M messages of an example follow
    parallel XOR paths (the Butterfly's own wiring). Over k and the pair, every unordered pair {i, j}
    is equally likely (it is the pair of exactly one k), so pair distances are distributed as in the
    random family (weight N - d). Fields as `make_messages`'s, plus `k` (B)."""
    n, m, g = config.n_leaves, messages, generator
    k = torch.randint(1, n, (count,), generator=g)
    top = 2 ** torch.floor(torch.log2(k.double())).long()  # k's highest set bit
    leaves = torch.arange(n)
    # the pairs' lower ends are the leaves with k's highest bit clear: N/2 of them; take M at random
    keys = torch.rand(count, n, generator=g) + ((leaves[None, :] & top[:, None]) != 0).float() * 2
    low = keys.argsort(dim=1)[:, :m]  # B x M
    high = low ^ k[:, None]
    source_low = torch.rand(count, m, generator=g) < 0.5
    source = torch.where(source_low, low, high)
    target = torch.where(source_low, high, low)
    full = torch.ones(count, n, dtype=torch.bool)
    return marked_pairs(config, g, source, target, full, torch.full((count,), n)) | {"k": k}


def make_load(
    config: ButterflyReachConfig, generator: torch.Generator, count: int, messages: int
) -> dict[str, torch.Tensor]:
    """`count` full-length examples of the load task with M = `messages` id-marked pairs each, of the
    config's `routing` family: `structured` (`make_structured`) or `random` (`make_messages`'s random
    draw, no distance forced). M = 1 is the id-marked task with one pair, not the single-message task."""
    if config.routing == "structured":
        return make_structured(config, generator, count, messages)
    return make_messages(config, generator, count, None, None, messages)


# ------------------------------------------------------------------------------------ model
class BagOfLeaves(nn.Module):
    """z_i = x_i + tanh(G(x_i + mean over present j of tanh(F(x_j)))): full reach, no addresses."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.F, self.G = mlp(d, hidden, d), mlp(d, hidden, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weight = mask.unsqueeze(-1).to(x.dtype)
        pooled = (torch.tanh(self.F(x)) * weight).sum(1, keepdim=True) / weight.sum(
            1, keepdim=True
        ).clamp(min=1)
        return x + torch.tanh(self.G(x + pooled))


class OneLayerAttention(nn.Module):
    """One layer of softmax attention over the present leaves (every leaf queries every present leaf;
    `heads` heads of width d / heads), then a residual MLP of the kernels' hidden width:
    y = x + O(attention(x)), z = y + MLP(y). Full reach and content addressing: the upper-bound control."""

    def __init__(self, d: int, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.mlp = mlp(d, hidden, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).unbind(2)
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))  # absent leaves: no key
        mixed = torch.einsum("bhqk,bkhe->bqhe", scores.softmax(-1), v).reshape(b, n, d)
        y = x + self.out(mixed)
        return y + self.mlp(y)


class ReachModel(nn.Module):
    def __init__(self, config: ButterflyReachConfig):
        super().__init__()
        self.config, d = config, config.d_model
        self.value_embed = nn.Embedding(config.values, d)
        self.role_embed = nn.Embedding(4, d)
        arm = config.arm
        if arm in ("butterfly", "adjacent", "butterfly_relay"):
            self.butterfly = Butterfly(d, config.hidden, config.depth)
        elif arm == "root_bottleneck":
            self.fold = Fold(
                d, config.hidden, config.fold, merge_hidden=config.merge_hidden or config.hidden
            )
        elif arm == "attention":
            self.attention = OneLayerAttention(d, config.hidden, config.heads)
        else:
            self.bag = BagOfLeaves(d, config.hidden)
        pairing = adjacent_pairing(config.n_leaves, config.depth) if arm == "adjacent" else []
        for r, (i, j) in enumerate(pairing):  # buffers, so they follow the model to its device
            self.register_buffer(f"pair_first_{r}", i, persistent=False)
            self.register_buffer(f"pair_second_{r}", j, persistent=False)
        self.head = nn.Linear(d, config.values)
        if config.multi:  # created last, so the defaults' initialisation is unchanged
            self.message_embed = nn.Embedding(config.n_ids + 1, d)
            if arm == "root_bottleneck":
                # the root arm's read: the root and the target's own input (its message id), as the
                # bag's G reads the pooled vector and the leaf: z_t = root + tanh(Q([root, x_t]))
                self.read = mlp(2 * d, config.read_hidden or config.hidden, d)
                if config.loads and config.fold == "mlp":
                    # the mlp FOLD's parent never uses P (it only feeds the details, which nothing
                    # reads here), so P gets no gradient: frozen, the count is of what trains
                    self.fold.P.requires_grad_(False)

    def embed(self, batch: dict) -> torch.Tensor:
        x = self.value_embed(batch["values"]) + self.role_embed(batch["role"])
        if self.config.multi:
            x = x + self.message_embed(batch["message"])
        return x

    def states(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """B x N x d: the state the head reads for a target at each leaf (the root's, broadcast, for
        root_bottleneck)."""
        arm = self.config.arm
        if arm == "butterfly":
            return self.butterfly(x, mask)
        if arm == "adjacent":
            pairing = [
                (getattr(self, f"pair_first_{r}"), getattr(self, f"pair_second_{r}"))
                for r in range(self.config.depth)
            ]
            return self.butterfly(x, mask, pairing)
        if arm == "butterfly_relay":
            return self.butterfly(x * mask.unsqueeze(-1), torch.ones_like(mask))
        if arm == "root_bottleneck":
            states, _, _ = fold_levels(self.fold, x, mask)
            root = states[0].expand(-1, x.shape[1], -1)
            if self.config.multi:
                return root + torch.tanh(self.read(torch.cat([root, x], -1)))
            return root
        if arm == "attention":
            return self.attention(x, mask)
        return self.bag(x, mask)

    def forward(self, batch: dict) -> torch.Tensor:
        """Logits over the V values at each example's target (B x V; B x M x V with messages > 1)."""
        z = self.states(self.embed(batch), batch["mask"])
        rows = torch.arange(z.shape[0], device=z.device)
        if batch["target"].dim() == 2:
            rows = rows[:, None]
        return self.head(z[rows, batch["target"]])


def influence(model: ReachModel, batch: dict, projections: int = 2, seed: int = 0) -> torch.Tensor:
    """B x N x N: [b, t, s] = |d(state at t) / d(input embedding at s)| (sum over `projections` random
    projections of the state, each a norm over the input's features), for every leaf pair."""
    x = model.embed(batch).detach().requires_grad_(True)
    with torch.enable_grad():
        z = model.states(x, batch["mask"])
        g = torch.Generator().manual_seed(seed)
        n = z.shape[1]
        out = torch.zeros(z.shape[0], n, n, dtype=torch.float64, device=z.device)
        for t in range(n):
            for _ in range(projections):
                r = torch.randn(z.shape[-1], generator=g).to(z.device)
                (grad,) = torch.autograd.grad((z[:, t] * r).sum(), x, retain_graph=True)
                out[:, t] += grad.double().norm(dim=-1)
    return out


def reach_stats(
    strength: torch.Tensor, mask: torch.Tensor, far: int
) -> tuple[dict[str, float], torch.Tensor]:
    """(mean, min and far shares of present sources influencing each present target, per-leaf counts)
    from `influence` and the mask; `far`: distances > far count as far."""
    present = mask[:, :, None] & mask[:, None, :]
    top = strength.amax(-1, keepdim=True)
    reaches = (strength > REACH_TOL * top) & present
    counts = reaches.sum(-1)  # B x N (targets)
    share = counts.double() / mask.sum(-1, keepdim=True).double()
    shares = share[mask]
    n = mask.shape[1]
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().to(mask.device)
    far_pairs = present & (distance > far)[None]
    far_share = float(reaches[far_pairs].double().mean()) if far_pairs.any() else 1.0
    return (
        {"mean": float(shares.mean()), "min": float(shares.min()), "far": far_share},
        torch.where(mask, counts, torch.full_like(counts, -1)),
    )


# ------------------------------------------------------------------------------------ study
def _declared() -> dict[str, Metric]:
    # cross-entropies that the arms which find the source drive towards 0 (val_loss 0.0004-0.002 for the
    # bag and the root, 0.8 for adjacent on butterfly-reach-v2): a multiplicative spread, log scale
    metrics = {
        "train_loss": positive("lower", "train", unit="nats"),
        "val_loss": positive("lower", "validation", unit="nats"),
        "val_acc": proportion("higher", "validation"),
    }
    for prefix in ("", "short_"):
        metrics[f"{prefix}test_acc"] = proportion("higher", "test")
        metrics[f"{prefix}accuracy_near"] = proportion("higher", "test")
        metrics[f"{prefix}accuracy_far"] = proportion("higher", "test")
        for d in range(MAX_LEAVES):
            metrics[f"{prefix}accuracy_at_distance_{d}"] = proportion("higher", "test")
        for stat in ("mean", "min", "far"):
            metrics[f"{prefix}{stat}_reach_share"] = proportion(
                "higher", "test"
            )  # of the trained model
            # of the untrained model, measured on the test examples: what the coupling can carry
            # (judged by butterfly-reach-v2; a trained model learns to ignore fillers, which is not reach)
            metrics[f"init_{prefix}{stat}_reach_share"] = proportion("higher", "test")
    # the load task: per load M, every message of the load's test set (test_acc),
    # those at near (1 .. D-1) and far (> D) pair distances, and whole examples with all M right; the
    # pooled `exact_match` averages the loads (test_acc, accuracy_near and accuracy_far likewise)
    metrics["exact_match"] = proportion("higher", "test", unit="share of examples")
    for m in range(1, MAX_LEAVES // 2 + 1):  # loads compared with each other: shares of one thing
        for name in ("test_acc", "near_acc", "far_acc"):
            metrics[f"{name}_m{m}"] = proportion("higher", "test", unit="share of messages")
        metrics[f"exact_match_m{m}"] = proportion("higher", "test", unit="share of examples")
    return metrics


LOAD_METRIC = re.compile(r"(test_acc|near_acc|far_acc|exact_match)_m(\d+)")


class ButterflyReachStudy(Study):
    """XOR Butterfly vs adjacent pairing vs root bottleneck vs bag of leaves on a marked-source task."""

    name: ClassVar[str] = "butterfly_reach"
    Config: ClassVar[type[StudyConfig]] = ButterflyReachConfig
    metrics: ClassVar[dict[str, Metric]] = _declared()
    deterministic: ClassVar[bool] = False  # metrics depend on the seed's data and initialisation
    hyperparameters: ClassVar[frozenset[str]] = frozenset({"lr", "clip_grad_norm"})
    # the task: N, the values, the distances asked, the short sequences and how many messages at once
    regime_fields: ClassVar[tuple[str, ...]] = (
        "depth",
        "values",
        "distances",
        "short_lengths",
        "short_fraction",
        "messages",
    )

    def param_count(self, config: ButterflyReachConfig) -> int:
        return count_parameters(ReachModel(config))

    def reported_metrics(self, config: ButterflyReachConfig) -> frozenset[str]:
        """Accuracy at each configured distance (with messages > 1 pair 0 of every test example sits at it;
        other pairs may add distances, reported but not promised), near / far where a configured distance is;
        the short_ ones at the distances shorter than the longest short length, and short reach, only with
        short_lengths; reach (trained and init_) always."""
        near, far = near_far(config)
        stats = ("mean", "min", "far")
        names = {"train_loss", "val_loss", "val_acc"}
        if (
            config.loads
        ):  # natural test draws per load: every message distance may occur, none is forced
            names |= {"test_acc", "accuracy_near", "accuracy_far", "exact_match"}
            names |= {
                f"{name}_m{m}"
                for m in config.loads
                for name in ("test_acc", "near_acc", "far_acc", "exact_match")
            }
            return frozenset(
                names | {f"{init}{stat}_reach_share" for init in ("", "init_") for stat in stats}
            )

        def accuracies(prefix: str, distances: list[int]) -> set[str]:
            out = {f"{prefix}test_acc"} | {f"{prefix}accuracy_at_distance_{d}" for d in distances}
            return out | {
                f"{prefix}accuracy_{name}"
                for name, group in (("near", near), ("far", far))
                if set(group) & set(distances)
            }

        names |= accuracies("", config.distances)
        names |= {f"{init}{stat}_reach_share" for init in ("", "init_") for stat in stats}
        if config.short_lengths:
            names |= accuracies(
                "short_", [d for d in config.distances if d < max(config.short_lengths)]
            )
            names |= {f"{init}short_{stat}_reach_share" for init in ("", "init_") for stat in stats}
        return frozenset(names)

    def chance(self, metric: str, config: ButterflyReachConfig) -> float | None:
        """The answer is a value drawn uniformly from `values`, independent of everything but the source
        leaf: guessing scores 1 / V on every accuracy, a uniform prediction log V nats."""
        if metric in ("train_loss", "val_loss"):
            return math.log(config.values)
        load = LOAD_METRIC.fullmatch(metric)
        if metric == "exact_match" or (load and load.group(1) == "exact_match"):
            # all M answers right by guessing: V^-M (the pooled one: its mean over the loads)
            loads = [int(load.group(2))] if load else (config.loads or [config.messages])
            return sum(config.values**-m for m in loads) / len(loads)
        if load:
            return 1 / config.values
        if metric == "val_acc" or "accuracy" in metric or metric.endswith("test_acc"):
            return 1 / config.values
        return None

    def run(self, config: ButterflyReachConfig, seed: int, reporter: Reporter) -> dict[str, float]:
        seed_everything(seed)
        device = torch.device(resolve_device(config.device))
        to = lambda batch: {k: v.to(device) for k, v in batch.items()}  # noqa: E731
        near, far = near_far(config)
        # data drawn on the CPU from the seed's own streams (train / test / validation / reach)
        test_g, val_g = (
            torch.Generator().manual_seed(seed * 4 + 1),
            torch.Generator().manual_seed(seed * 4 + 2),
        )
        if config.loads:  # the load task: a test and a validation set per load M, natural draws
            load_sets = {
                m: to(make_load(config, test_g, config.test_examples, m)) for m in config.loads
            }
            val_sets = {
                m: to(make_load(config, val_g, config.val_examples, m)) for m in config.loads
            }
        else:
            full_sets = {
                d: to(make_examples(config, test_g, config.test_examples, None, d))
                for d in config.distances
            }
            short_sets = {
                d: to(make_examples(config, test_g, config.test_examples, config.short_lengths, d))
                for d in config.distances
                if config.short_lengths and d < max(config.short_lengths)
            }
            n_short_val = (
                round(config.val_examples * config.short_fraction) if config.short_lengths else 0
            )
            val_parts = [make_examples(config, val_g, config.val_examples - n_short_val, None)]
            if n_short_val:
                val_parts.append(make_examples(config, val_g, n_short_val, config.short_lengths))
            val = to(
                {k: torch.cat([p[k] for p in val_parts]) for k in val_parts[0]}
            )  # mixed like training
        reach_g = torch.Generator().manual_seed(seed * 4 + 3)
        reach_full = to(
            make_load(config, reach_g, 4, max(config.loads))
            if config.loads
            else make_examples(config, reach_g, 4, None)
        )
        reach_short = {
            length: to(make_examples(config, reach_g, 1, [length]))
            for length in config.short_lengths
        }

        model = ReachModel(config).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
        train_g = torch.Generator().manual_seed(seed * 4)
        n_short = round(config.batch_size * config.short_fraction) if config.short_lengths else 0

        def measure_reach(prefix: str) -> tuple[dict[str, float], str]:
            model.eval()
            stats, full_counts = reach_stats(
                influence(model, reach_full), reach_full["mask"], config.depth
            )
            out = {f"{prefix}{k}_reach_share": v for k, v in stats.items()}
            lines = ["full length: influencing sources per target leaf (rows: examples)"]
            lines += [" ".join(f"{c:2d}" for c in row.tolist()) for row in full_counts]
            short_stats = []
            for length, batch in reach_short.items():
                s, counts = reach_stats(influence(model, batch), batch["mask"], config.depth)
                short_stats.append(s)
                lines.append(
                    f"L = {length}: " + " ".join(f"{c:2d}" for c in counts[0, :length].tolist())
                )
            if short_stats:
                out[f"{prefix}short_mean_reach_share"] = sum(s["mean"] for s in short_stats) / len(
                    short_stats
                )
                out[f"{prefix}short_min_reach_share"] = min(s["min"] for s in short_stats)
                out[f"{prefix}short_far_reach_share"] = sum(s["far"] for s in short_stats) / len(
                    short_stats
                )
            model.train()
            return out, "\n".join(lines)

        init_reach, init_table = measure_reach("init_")

        def loss_fn() -> torch.Tensor:
            if (
                config.loads
            ):  # one load per batch, uniform over the loads (a batch is B x M messages)
                m = config.loads[int(torch.randint(len(config.loads), (1,), generator=train_g))]
                batch = to(make_load(config, train_g, config.batch_size, m))
                return F.cross_entropy(model(batch).flatten(0, -2), batch["answer"].flatten())
            parts = [make_examples(config, train_g, config.batch_size - n_short, None)]
            if n_short:
                parts.append(make_examples(config, train_g, n_short, config.short_lengths))
            batch = to({k: torch.cat([p[k] for p in parts]) for k in parts[0]})
            return F.cross_entropy(model(batch).flatten(0, -2), batch["answer"].flatten())

        def accuracy(sets: dict, prefix: str) -> dict[str, float]:
            if not sets:  # no short test sets (short_lengths: []): nothing to report
                return {}
            if config.messages > 1:
                return message_accuracy(sets, prefix)
            hits = {
                d: (model(b).argmax(-1) == b["answer"]).double().mean().item()
                for d, b in sets.items()
            }
            out = {f"{prefix}accuracy_at_distance_{d}": h for d, h in hits.items()}
            out[f"{prefix}test_acc"] = sum(hits.values()) / len(hits)
            for name, group in (("near", near), ("far", far)):
                inside = [hits[d] for d in group if d in hits]
                if inside:
                    out[f"{prefix}accuracy_{name}"] = sum(inside) / len(inside)
            return out

        def message_accuracy(sets: dict, prefix: str) -> dict[str, float]:
            """Multi-message: every message of every test example (the sets of all distances pooled),
            grouped by its own pair's distance; near / far / test_acc pool messages likewise."""
            if not sets:
                return {}
            hits = torch.cat(
                [(model(b).argmax(-1) == b["answer"]).flatten() for b in sets.values()]
            ).double()
            dist = torch.cat([b["distance"].flatten() for b in sets.values()])
            out = {
                f"{prefix}accuracy_at_distance_{d}": hits[dist == d].mean().item()
                for d in sorted(set(dist.tolist()))
            }
            out[f"{prefix}test_acc"] = hits.mean().item()
            for name, inside in (
                ("near", (dist >= 1) & (dist <= config.depth - 1)),
                ("far", dist > config.depth),
            ):
                if inside.any():
                    out[f"{prefix}accuracy_{name}"] = hits[inside].mean().item()
            return out

        def load_metrics() -> dict[str, float]:
            """The load task: per load M, every message of its test set (`test_acc_m<M>`), those at near
            and far pair distances, whole examples (`exact_match_m<M>`); the pooled ones are their means
            over the loads (each load weighs the same); `accuracy_at_distance_<d>` pools the messages of
            every load. val_loss / val_acc: the mean over the loads of each load's validation set."""
            out: dict[str, float] = {}
            pooled: dict[str, list[float]] = {}
            hits_all, dist_all = [], []
            for m, b in load_sets.items():
                hits = model(b).argmax(-1) == b["answer"]  # B x M
                dist = b["distance"]
                values = {
                    "test_acc": hits.double().mean().item(),
                    "exact_match": hits.all(1).double().mean().item(),
                }
                for name, inside in (
                    ("near_acc", (dist >= 1) & (dist <= config.depth - 1)),
                    ("far_acc", dist > config.depth),
                ):
                    if inside.any():
                        values[name] = hits[inside].double().mean().item()
                for name, value in values.items():
                    out[f"{name}_m{m}"] = value
                    pooled.setdefault(name, []).append(value)
                hits_all.append(hits.flatten())
                dist_all.append(dist.flatten())
            for name, key in (
                ("test_acc", "test_acc"),
                ("exact_match", "exact_match"),
                ("near_acc", "accuracy_near"),
                ("far_acc", "accuracy_far"),
            ):
                if pooled.get(name):
                    out[key] = sum(pooled[name]) / len(pooled[name])
            hits, dist = torch.cat(hits_all).double(), torch.cat(dist_all)
            for d in sorted(set(dist.tolist())):
                out[f"accuracy_at_distance_{d}"] = hits[dist == d].mean().item()
            losses, accs = [], []
            for b in val_sets.values():
                logits, answer = model(b).flatten(0, -2), b["answer"].flatten()
                losses.append(F.cross_entropy(logits, answer).item())
                accs.append((logits.argmax(-1) == answer).double().mean().item())
            out["val_loss"] = sum(losses) / len(losses)
            out["val_acc"] = sum(accs) / len(accs)
            return out

        def evaluate() -> dict[str, float]:
            if config.loads:
                return load_metrics()
            logits = model(val).flatten(0, -2)
            answer = val["answer"].flatten()
            return {
                **accuracy(full_sets, ""),
                **accuracy(short_sets, "short_"),
                "val_loss": F.cross_entropy(logits, answer).item(),
                "val_acc": (logits.argmax(-1) == answer).double().mean().item(),
            }

        final = train_loop(
            model, optimizer, loss_fn, reporter.budget, reporter, evaluate, config.clip_grad_norm
        )
        final_reach, final_table = measure_reach("")
        reporter.attach("reach.txt", f"untrained\n{init_table}\n\ntrained\n{final_table}\n")
        return {**final, **init_reach, **final_reach}
