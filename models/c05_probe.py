"""C05 structural probe: does a TreeHeap kernel need the subheap? (seed 002, studies.md section 1)

The question. A TreeHeap write picks an address a with softmax_a K(pi(a), subheap(H, a), x). If
K only sees a flat address id, the "tree" is a flat soft memory under another name. The probe
plants a query pattern x = (root, left, right) at one internal node of a full binary tree of
N(0, sigma^2) values and asks a kernel to find it, training on shallow trees and testing on deep
ones. A kernel that reads the subheap should transfer; one that memorised addresses should not.

Data (numpy, from the seed; deterministic). Trees live in heap (BFS) layout over one global
address space of size A = 2^(D_max+1) - 1, D_max the largest depth in the config: node i has
children 2i+1 and 2i+2, and a tree of depth D owns addresses 0 .. 2^(D+1)-2 (its internal nodes
are those at depth < D). Addresses beyond a tree's depth have value 0 and `exists` 0.
- Train trees: depth uniform over `train_depths`; the pattern's node uniform over the tree's
  internal nodes.
- Test trees: depth uniform over `test_depths` (each deeper than every train depth); the pattern's
  node uniform over the internal nodes at depth >= max(train_depths). No train tree has an
  internal node that deep, so every test target is an address that was never a possible target
  in training: unseen depths and unseen addresses.

Task: score every address, softmax over the addresses that exist in the tree (the rest masked
with -inf), cross-entropy against the pattern's address; the prediction is the argmax.

Arms (what the kernel K sees; each is a small MLP Linear(in, hidden) - ReLU - Linear(hidden, 1)
shared over addresses):
- `flat_address`: the absolute address id only (an embedding row is the first layer). Addresses
  never seen in training keep their initialisation.
- `path_only`: the L/R path pi(a), a fixed code of 2*D_max numbers, (is_L, is_R) per step,
  zeros after the path ends.
- `subheap_kernel`: the candidate's value, its two children's values (0 for a leaf) and x.
- `path_subheap_kernel`: both, concatenated.
- `message_passing`: a generic model, not a kernel: it sees every node's value AND its position.
  Each node starts from (its value, x, a one-hot of its depth (D_max+1), its L/R path code
  (2*D_max)), embedded by Linear - ReLU to width `hidden`; then MESSAGE_ROUNDS rounds in which
  every node's state is updated from [its own, its parent's, its left child's, its right child's]
  states (typed edges, one Linear(4*hidden, hidden) - ReLU per round; missing neighbours and nodes
  outside the tree carry zero states); a Linear(hidden, 1) scores each node. After two rounds a
  node's score can depend on its grandparent to its grandchildren and on where it sits, so it sees
  everything `path_subheap_kernel` sees and more (depth, parent, sibling, grandchildren), and may
  lean on position where the kernels cannot (c05-structural-probe-v4 asks which generalises).

Metrics: train_loss, train_acc, test_acc, hit_at_3, mean_rank (1-based, among the test tree's
existing nodes), val_loss and val_acc (on `val_trees` held-out trees drawn like the train trees, from
their own random stream: the split a contract's `tuning` selects on, never the test trees),
route_valid_rate (the predicted address is turned into L/R steps and walked from
the root of its tree; valid when every step lands on an existing node and the walk ends on an
internal node, i.e. a subheap a recursive Plus could descend into and rebuild), test_loss.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator
from torch import nn

from gates.models.common import count_parameters, seed_everything, train_loop
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

Depth = Annotated[int, Field(ge=1, le=12)]  # 12: an 8191-address space, still quick on CPU
Features = Literal[
    "flat_address", "path_only", "subheap_kernel", "path_subheap_kernel", "message_passing"
]
MESSAGE_ROUNDS = 2  # message_passing: parent <-> child rounds (a fixed part of the arm, not a knob)


class C05ProbeConfig(DeviceConfig):
    """One arm of the C05 probe: which features the kernel sees, and the task's parameters."""

    features: Features = "subheap_kernel"
    pattern: tuple[float, float, float] = (5.0, -4.0, 3.0)  # (root, left, right) = the query x
    sigma: float = Field(default=1.0, gt=0)  # node values ~ N(0, sigma^2)
    train_depths: list[Depth] = Field(default_factory=lambda: [2, 3], min_length=1)
    test_depths: list[Depth] = Field(default_factory=lambda: [5, 6], min_length=1)
    train_trees: int = Field(default=900, ge=1)
    test_trees: int = Field(default=400, ge=1)
    val_trees: int = Field(
        default=200, ge=1
    )  # held-out shallow trees for tuning (val_loss, val_acc)
    hidden: int = Field(default=32, ge=1)
    lr: float = Field(default=0.01, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)

    @field_validator("pattern")
    @classmethod
    def _finite_pattern(cls, pattern: tuple[float, float, float]) -> tuple[float, float, float]:
        if not all(np.isfinite(pattern)):
            raise ValueError("pattern values must be finite")
        return pattern

    @model_validator(mode="after")
    def _test_deeper_than_train(self) -> C05ProbeConfig:
        # test targets sit at depth >= max(train_depths), which must be an internal depth (< D)
        if min(self.test_depths) <= max(self.train_depths):
            raise ValueError(
                f"every test depth must exceed every train depth (test {self.test_depths}, "
                f"train {self.train_depths}): test patterns go at depth >= max(train_depths)"
            )
        return self

    @property
    def max_depth(self) -> int:
        return max(self.train_depths + self.test_depths)

    @property
    def num_addresses(self) -> int:
        return 2 ** (self.max_depth + 1) - 1


# ------------------------------------------------------------------------------------ addresses
def address_paths(max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """L/R path of every heap address: bits (A, max_depth) with 0 = L, 1 = R (0-padded), lengths (A,).

    Address i is the binary number i+1 without its leading 1, read most significant bit first:
    1 -> "0" (L), 2 -> "1" (R), 3 -> "00" (LL), 10 -> 11 = 0b1011 -> "011" (LRR).
    """
    index = np.arange(2 ** (max_depth + 1) - 1) + 1
    lengths = np.floor(np.log2(index)).astype(np.int64)  # the node's depth
    steps = np.arange(max_depth)
    shift = lengths[:, None] - 1 - steps[None, :]
    bits = np.where(shift >= 0, (index[:, None] >> np.maximum(shift, 0)) & 1, 0)
    return bits.astype(np.int64), lengths


def path_code(max_depth: int) -> torch.Tensor:
    """The fixed path feature, (A, 2*max_depth): per step (is_L, is_R), zeros after the path ends."""
    bits, lengths = address_paths(max_depth)
    on_path = np.arange(max_depth)[None, :] < lengths[:, None]
    code = np.stack([on_path & (bits == 0), on_path & (bits == 1)], axis=-1)  # (A, D, 2)
    return torch.from_numpy(code.reshape(len(bits), 2 * max_depth).astype(np.float32))


def walk_route(
    bits: torch.Tensor, lengths: torch.Tensor, exists: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Walk each path from its tree's root, one L/R step at a time (vectorised over trees).

    bits (B, D) and lengths (B,) are paths, exists (B, A) the trees. Returns the node reached (B,)
    and whether every node on the way, the root included, exists (B,).
    """
    num_trees, num_addresses = exists.shape
    node = torch.zeros(num_trees, dtype=torch.long, device=exists.device)
    ok = exists[:, 0].clone()
    for t in range(bits.shape[1]):  # over path steps (<= D_max), never over trees or nodes
        moving = t < lengths
        child = 2 * node + 1 + bits[:, t]
        in_space = child < num_addresses
        child_exists = (
            exists.gather(1, child.clamp(max=num_addresses - 1)[:, None])[:, 0] & in_space
        )
        ok = ok & (~moving | child_exists)
        node = torch.where(moving & in_space, child, node)
    return node, ok


def is_internal(node: torch.Tensor, exists: torch.Tensor) -> torch.Tensor:
    """Whether each tree's `node` exists and has both children (a subheap to descend into)."""
    num_addresses = exists.shape[1]
    left, right = 2 * node + 1, 2 * node + 2
    has_children = right < num_addresses
    gather = lambda i: exists.gather(1, i.clamp(max=num_addresses - 1)[:, None])[:, 0]  # noqa: E731
    return gather(node) & has_children & gather(left) & gather(right)


# ------------------------------------------------------------------------------------ data
def make_trees(
    rng: np.random.Generator,
    num_trees: int,
    depths: list[int],
    pattern_min_depth: int,
    pattern: tuple[float, float, float],
    sigma: float,
    max_depth: int,
) -> dict[str, torch.Tensor]:
    """Trees with a planted pattern, in heap layout over the global address space.

    The pattern's node is uniform over the tree's internal nodes at depth >= pattern_min_depth.
    Returns values (B, A), exists (B, A) bool, subheap (B, A, 3) = (value, left child, right
    child) per address with 0 for missing nodes, target (B,) and depth (B,).
    """
    num_addresses = 2 ** (max_depth + 1) - 1
    depth = rng.choice(np.asarray(depths), size=num_trees)
    exists = np.arange(num_addresses)[None, :] < (2 ** (depth + 1) - 1)[:, None]
    values = np.where(exists, rng.normal(0.0, sigma, size=(num_trees, num_addresses)), 0.0)
    first = 2**pattern_min_depth - 1  # first address at depth pattern_min_depth
    target = rng.integers(first, 2**depth - 1)  # internal nodes: addresses 0 .. 2^D - 2
    rows = np.arange(num_trees)
    values[rows, target] = pattern[0]
    values[rows, 2 * target + 1] = pattern[1]
    values[rows, 2 * target + 2] = pattern[2]

    # children of address i are 2i+1, 2i+2 <= 2A: pad with zeros so leaves read 0 children
    padded = np.concatenate([values, np.zeros((num_trees, num_addresses + 1))], axis=1)
    children = 2 * np.arange(num_addresses) + 1
    subheap = np.stack([values, padded[:, children], padded[:, children + 1]], axis=-1)
    return {
        "values": torch.from_numpy(values.astype(np.float32)),
        "exists": torch.from_numpy(exists),
        "subheap": torch.from_numpy(subheap.astype(np.float32)),
        "target": torch.from_numpy(target.astype(np.int64)),
        "depth": torch.from_numpy(depth.astype(np.int64)),
    }


def make_datasets(config: C05ProbeConfig, seed: int) -> tuple[dict, dict]:
    """Train and test sets; independent streams so changing one's size leaves the other alone."""
    common = dict(pattern=config.pattern, sigma=config.sigma, max_depth=config.max_depth)
    train = make_trees(
        np.random.default_rng([seed, 0]),
        config.train_trees,
        config.train_depths,
        pattern_min_depth=0,
        **common,
    )
    test = make_trees(
        np.random.default_rng([seed, 1]),
        config.test_trees,
        config.test_depths,
        pattern_min_depth=max(config.train_depths),
        **common,
    )
    return train, test


def crop_to_own_addresses(trees: dict) -> dict:
    """Keep only the heap prefix the set's deepest tree owns; the rest exists in no tree here.

    The same loss and gradients up to float rounding (those addresses are masked to -inf anyway,
    so they get zero probability and zero gradient), but the train trees (depth <= 3: 15 of 127
    addresses) become ~8x cheaper to score.
    """
    owned = 2 ** (int(trees["depth"].max()) + 1) - 1
    return {key: value[:, :owned] if value.dim() >= 2 else value for key, value in trees.items()}


def make_validation(config: C05ProbeConfig, seed: int) -> dict:
    """Held-out trees drawn like the train trees (same depths, pattern anywhere), from a third stream:
    tuning selects on them, so the test trees stay unseen by every choice made before the verdict."""
    return make_trees(
        np.random.default_rng([seed, 2]),
        config.val_trees,
        config.train_depths,
        pattern_min_depth=0,
        pattern=config.pattern,
        sigma=config.sigma,
        max_depth=config.max_depth,
    )


# ------------------------------------------------------------------------------------ model
class StructuralKernel(nn.Module):
    """K(pi(a), subheap(H, a), x) -> one score per address, an MLP shared over addresses.

    Only the inputs differ between arms. flat_address and path_only scores do not depend on the
    tree, so they are computed once per address and broadcast over the batch.
    """

    def __init__(self, config: C05ProbeConfig):
        super().__init__()
        self.features = config.features
        self.register_buffer("path", path_code(config.max_depth))  # (A, 2*D_max), fixed
        self.register_buffer("query", torch.tensor(config.pattern, dtype=torch.float32))  # x
        if self.features == "flat_address":
            # an embedding row is Linear(one_hot(a)) without a bias: the address id and nothing else
            self.first = nn.Embedding(config.num_addresses, config.hidden)
        else:
            self.first = nn.Linear(kernel_inputs(config), config.hidden)
        self.out = nn.Linear(config.hidden, 1)

    def forward(self, subheap: torch.Tensor) -> torch.Tensor:
        """subheap (B, A', 3) -> scores (B, A') for the first A' <= A addresses (a heap prefix)."""
        num_trees, num_addresses, _ = subheap.shape
        path = self.path[:num_addresses]
        if self.features == "flat_address":
            h = self.first.weight[:num_addresses]  # row a is address a's first-layer activation
        elif self.features == "path_only":
            h = self.first(path)  # (A', hidden)
        else:
            parts = [subheap, self.query.expand(num_trees, num_addresses, 3)]
            if self.features == "path_subheap_kernel":
                parts.append(path.expand(num_trees, -1, -1))
            h = self.first(torch.cat(parts, dim=-1))  # (B, A, hidden)
        scores = self.out(F.relu(h)).squeeze(-1)
        return scores.expand(num_trees, num_addresses)


class TreeMessagePassing(nn.Module):
    """The generic arm (`message_passing`): a typed-edge message-passing network over the tree's nodes.

    Node input: (value, x, one_hot(depth), path code); MESSAGE_ROUNDS rounds of
    h <- ReLU(W [h, h_parent, h_left, h_right] + b) with states outside the tree zeroed; one score per
    node. Module creation (hence parameter initialisation) happens only for this arm, so the kernels'
    arms draw exactly the random numbers they drew before this class existed.
    """

    def __init__(self, config: C05ProbeConfig):
        super().__init__()
        _, depth = address_paths(config.max_depth)
        depth_code = F.one_hot(torch.from_numpy(depth), config.max_depth + 1).float()
        position = torch.cat([depth_code, path_code(config.max_depth)], dim=1)
        self.register_buffer("position", position)  # (A, D_max + 1 + 2*D_max), fixed
        self.register_buffer("query", torch.tensor(config.pattern, dtype=torch.float32))  # x
        self.embed = nn.Linear(kernel_inputs(config), config.hidden)
        self.rounds = nn.ModuleList(
            nn.Linear(4 * config.hidden, config.hidden) for _ in range(MESSAGE_ROUNDS)
        )
        self.out = nn.Linear(config.hidden, 1)

    def forward(self, subheap: torch.Tensor, exists: torch.Tensor) -> torch.Tensor:
        """subheap (B, A', 3) (only its values, [..., 0], are read) and exists (B, A') -> scores (B, A')."""
        num_trees, num_addresses, _ = subheap.shape
        inputs = [
            subheap[..., :1],
            self.query.expand(num_trees, num_addresses, 3),
            self.position[:num_addresses].expand(num_trees, -1, -1),
        ]
        inside = exists[..., None].to(subheap.dtype)
        h = F.relu(self.embed(torch.cat(inputs, dim=-1))) * inside
        # neighbours in heap layout; index A' (a zero row appended below) stands for "none"
        address = torch.arange(num_addresses, device=subheap.device)
        none = torch.full_like(address, num_addresses)
        parent = torch.where(address > 0, (address - 1) // 2, none)
        left = torch.where(2 * address + 1 < num_addresses, 2 * address + 1, none)
        right = torch.where(2 * address + 2 < num_addresses, 2 * address + 2, none)
        for layer in self.rounds:
            padded = torch.cat([h, h.new_zeros(num_trees, 1, h.shape[-1])], dim=1)
            messages = [padded[:, parent], padded[:, left], padded[:, right]]
            h = F.relu(layer(torch.cat([h, *messages], dim=-1))) * inside
        return self.out(h).squeeze(-1)


def make_kernel(config: C05ProbeConfig) -> nn.Module:
    """The arm's scorer: the generic message-passing network or a structural kernel."""
    if config.features == "message_passing":
        return TreeMessagePassing(config)
    return StructuralKernel(config)


def kernel_inputs(config: C05ProbeConfig) -> int:
    """Width of the kernel MLP's input (flat_address: the one-hot address, i.e. A; message_passing:
    its per-node input: value, x, one-hot depth, path code)."""
    path = 2 * config.max_depth
    subheap = 6  # candidate, left child, right child, and the 3 query values
    return {
        "flat_address": config.num_addresses,
        "path_only": path,
        "subheap_kernel": subheap,
        "path_subheap_kernel": path + subheap,
        "message_passing": 1 + 3 + (config.max_depth + 1) + path,
    }[config.features]


def masked_scores(model: nn.Module, trees: dict) -> torch.Tensor:
    """Scores with addresses outside the tree at -inf, so softmax and argmax only see its nodes."""
    if isinstance(model, TreeMessagePassing):
        scores = model(trees["subheap"], trees["exists"])
    else:
        scores = model(trees["subheap"])
    return scores.masked_fill(~trees["exists"], float("-inf"))


def target_rank(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1-based rank of the target; ties broken like argmax (lower address first), so rank 1 == hit.

    -inf (missing) addresses never outrank a finite target score.
    """
    target_score = scores.gather(1, target[:, None])
    address = torch.arange(scores.shape[1], device=scores.device)[None, :]
    ahead = (scores > target_score) | ((scores == target_score) & (address < target[:, None]))
    return 1 + ahead.sum(dim=1)


# ------------------------------------------------------------------------------------ study
TEST_SET = (
    "test_acc",
    "hit_at_3",
    "mean_rank",
    "route_valid_rate",
    "test_loss",
)  # metrics of the test trees


def node_counts(depths: list[int]) -> list[int]:
    """Nodes of a full binary tree of each depth (every one is a candidate the kernel scores)."""
    return [2 ** (depth + 1) - 1 for depth in depths]


class C05ProbeStudy(Study):
    """Flat address vs path vs subheap kernels; train shallow, test deep (see module docstring)."""

    name: ClassVar[str] = "c05_probe"
    Config: ClassVar[type[StudyConfig]] = C05ProbeConfig
    # the cross-entropies are driven towards 0 by the arms that find the pattern (subheap test_loss 1.4e-4 to
    # 8.8e-4 over seeds: a multiplicative spread) and sit near log(nodes) for the others: log scale
    metrics: ClassVar[dict[str, Metric]] = {
        "train_loss": positive("lower", "train", unit="nats"),
        "train_acc": proportion("higher", "train"),
        "test_acc": proportion("higher", "test"),
        "hit_at_3": proportion("higher", "test"),
        "mean_rank": Metric(
            "lower",
            "test",
            1.0,
            None,
            linear_reason="an average of ranks over hundreds of test trees: roughly normal per seed",
        ),  # 1-based: rank 1 is a hit; at most the node count
        # on the test trees' predictions, but a property of the predicted route, not of finding the target
        "route_valid_rate": proportion("higher", "diagnostic"),
        "test_loss": positive("lower", "test", unit="nats"),
        "val_loss": positive("lower", "validation", unit="nats"),
        "val_acc": proportion("higher", "validation"),
    }
    deterministic: ClassVar[bool] = False  # metrics depend on the seed's trees and init
    hyperparameters: ClassVar[frozenset[str]] = frozenset({"lr", "weight_decay"})
    # the task: which pattern in which noise, on trees of which depths and how many (c05-structural-probe-hard
    # is the hard pattern's regime; the others share the easy one)
    regime_fields: ClassVar[tuple[str, ...]] = (
        "pattern",
        "sigma",
        "train_depths",
        "test_depths",
        "train_trees",
        "test_trees",
    )

    def metric_range(
        self, metric: str, config: C05ProbeConfig
    ) -> tuple[float | None, float | None]:
        """mean_rank: a test target's rank is at most its tree's node count, 2^(D+1) - 1 at the deepest D."""
        if metric == "mean_rank":
            return 1.0, float(max(node_counts(config.test_depths)))
        return super().metric_range(metric, config)

    def chance(self, metric: str, config: C05ProbeConfig) -> float | None:
        """A scorer that learned nothing ranks the n nodes of a tree (leaves included: every existing node is
        scored) in a uniformly random order, or scores them all alike (the losses: log n exactly); averaged
        over the depths a set draws from (`rng.choice` over the config's list: each entry equally likely).
        Test metrics on the test trees, the rest on trees drawn like the training trees."""
        counts = np.asarray(
            node_counts(config.test_depths if metric in TEST_SET else config.train_depths), float
        )
        internal = (counts - 1) / 2  # a full binary tree of n nodes has (n - 1) / 2 internal ones
        per_tree = {
            "train_acc": 1 / counts,
            "val_acc": 1 / counts,
            "test_acc": 1 / counts,
            "hit_at_3": np.minimum(3, counts) / counts,
            "mean_rank": (counts + 1) / 2,
            "route_valid_rate": internal
            / counts,  # every node walks from the root; internal ones count
            "train_loss": np.log(counts),
            "val_loss": np.log(counts),
            "test_loss": np.log(counts),
        }
        return float(per_tree[metric].mean()) if metric in per_tree else None

    def param_count(self, config: C05ProbeConfig) -> int:
        return count_parameters(make_kernel(config))

    def flops(self, config: C05ProbeConfig) -> int:
        """2 x multiply-adds of the kernel MLP per scored address (rough; biases and ReLU ignored).

        flat_address's first layer is a table lookup, counted as 0 multiply-adds. message_passing: its
        embedding, MESSAGE_ROUNDS rounds of a (4*hidden, hidden) map and the output, per node.
        """
        if config.features == "message_passing":
            hidden = config.hidden
            rounds = MESSAGE_ROUNDS * 4 * hidden * hidden
            return 2 * (kernel_inputs(config) * hidden + rounds + hidden)
        first = 0 if config.features == "flat_address" else kernel_inputs(config) * config.hidden
        return 2 * (first + config.hidden)

    def run(self, config: C05ProbeConfig, seed: int, reporter: Reporter) -> dict[str, float]:
        seed_everything(seed)
        device = torch.device(resolve_device(config.device))
        # data drawn by numpy and the model initialised on the CPU (the same on every device), then moved
        on_device = lambda trees: {key: value.to(device) for key, value in trees.items()}  # noqa: E731
        train, test = (
            on_device(crop_to_own_addresses(trees)) for trees in make_datasets(config, seed)
        )
        val = on_device(crop_to_own_addresses(make_validation(config, seed)))
        model = make_kernel(config).to(device)
        optimizer = torch.optim.Adam(
            model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        paths, path_lengths = (
            torch.from_numpy(a).to(device) for a in address_paths(config.max_depth)
        )

        def loss_fn() -> torch.Tensor:
            return F.cross_entropy(masked_scores(model, train), train["target"])

        def evaluate() -> dict[str, float]:
            train_scores = masked_scores(model, train)
            scores = masked_scores(model, test)
            prediction = scores.argmax(dim=1)
            rank = target_rank(scores, test["target"]).float()
            # route validity: walk the predicted address's L/R steps from the root of its tree
            reached, walked = walk_route(
                paths[prediction], path_lengths[prediction], test["exists"]
            )
            route_valid = walked & is_internal(reached, test["exists"])
            val_scores = masked_scores(model, val)
            return {
                "train_acc": (train_scores.argmax(dim=1) == train["target"]).float().mean().item(),
                "test_acc": (prediction == test["target"]).float().mean().item(),
                "hit_at_3": (rank <= 3).float().mean().item(),
                "mean_rank": rank.mean().item(),
                "route_valid_rate": route_valid.float().mean().item(),
                "test_loss": F.cross_entropy(scores, test["target"]).item(),
                "val_loss": F.cross_entropy(val_scores, val["target"]).item(),
                "val_acc": (val_scores.argmax(dim=1) == val["target"]).float().mean().item(),
            }

        return train_loop(model, optimizer, loss_fn, reporter.budget, reporter, evaluate)
