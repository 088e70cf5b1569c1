"""Relation closure (SPR-096 stages A-C): can a parent summarise how its leaves answer queries?

Stage A (`models.teacher`): a small dense query-key reader trained once on a real corpus, frozen;
the queries and keys of one of its attention layers (`teacher_layer`, default the last) are the
leaves and the queries here. Stages B and C
(`models.relation_tree`): parents fitted to the exact responses z_p(q) = logsumexp of their
descendants' scores, then read. This module only picks the data and wires the pieces into a Study.

Leaf sets, per seed (the teacher is fixed; the seed draws the data and the fits):
- `context`: `trees` per-context trees, each the N = `leaves` keys of one window of the training
  slice (N consecutive positions, all visible: the tree indexes a context; studies.md N = 32..256);
- `bank`: one memory tree of N keys pooled from many training windows (N up to 65,536).
Queries (`query_set`):
- `heldout_windows`: from held-out windows: the held-out windows are shuffled by the seed, the first
  half feed the fit queries and the second half the evaluation queries, so fit and evaluation
  queries never share a window. The same queries read every tree of a seed. Reading a context with
  queries of other text gives a near-uniform dense posterior, which any summary approximates
  (studies.md section 2): kept for the contracts recorded with it.
- `continuation` (context trees only): the teacher's own attention over the window. Each tree's
  window is the first N positions of a recorded window of `max_positions` tokens; its queries are
  that window's later positions N..max_positions-1, each of which sees every key of the tree under
  the causal mask, so the dense posterior over the tree's leaves is the teacher's own attention
  restricted to the context. The later positions are split by the seed into fit, validation
  (`val_queries`, optional) and evaluation positions (the same positions for every tree);
  `dense_entropy` measures how peaked the posterior is.

Arms choose a parent (`single_key`, `prototypes` m, `lowrank`, `mlp` sized to match prototypes
m = `mlp_match_prototypes` (with `mlp_residual`, a correction to one key per node), `oracle`, or
`dense`: no tree, the exact read the tree is measured against), a topology (`positional`,
`random`, `learned`, `kmeans`) and a read (`soft` only, or also a cheap `beam` / `drilldown` read; a
beam without a width is calibrated on FIT queries to `target_recall` top-10 recall and then measured
on evaluation queries; `fast_beam` is `models.tree_read`'s GEMM-shaped
read of a bank, its schedule calibrated on fit queries the same way).

Budget: `steps` are Adam steps of the parent fit; every `eval_every` steps the fit loss, the
closure error on evaluation queries and (with validation queries) val_closure_error are reported;
the last report carries every metric. A parent with more parameters than fit targets keeps lowering
its fit loss long after it stops generalising, so a contract's convergence rule reads
val_closure_error, not fit_loss.
"""

from __future__ import annotations

import math
import sys
from typing import ClassVar, Literal, NamedTuple

import torch
from pydantic import Field, model_validator

from gates.models import relation_tree as rt
from gates.models import tree_read as tr
from gates.models.common import seed_everything
from gates.models.teacher import TeacherConfig, load_or_train
from gates.study import (
    Ceiling,
    DeviceConfig,
    Metric,
    Reporter,
    Study,
    StudyConfig,
    nonnegative,
    positive,
    proportion,
    resolve_device,
)

MAX_DEPTH = 16  # N <= 65,536 leaves
QUERY_WINDOW = 128  # held-out windows the queries come from
CONTEXT_POOL = 2048  # training windows a seed draws its per-context trees from
BANK_WINDOW = 128
PROBE_QUERIES = 128  # evaluation queries used for the closure error at intermediate reports
# topology_mass's random trees: their own generator, seeded apart from the arm's draws, so that every
# arm of a seed measures against the same random trees of the same keys; their mean, as one random
# tree's mass varies by a few hundredths (a pilot: 0.47 and 0.50 for two random trees of one seed)
RANDOM_TREE_SEED = 2**20
RANDOM_TREES = 8


class RelationClosureConfig(DeviceConfig):
    teacher: TeacherConfig = TeacherConfig()
    teacher_layer: int | None = Field(
        default=None,
        ge=0,
        description="the attention layer whose queries and keys are read (None: the last)",
    )
    leaf_set: Literal["context", "bank"] = "context"
    leaves: int = Field(default=64, ge=4, le=2**MAX_DEPTH, description="N, a power of two")
    trees: int = Field(default=32, ge=1, description="per-context trees per seed (bank: 1)")
    query_set: Literal["heldout_windows", "continuation"] = "heldout_windows"
    fit_queries: int = Field(default=1024, ge=8, description="continuation: per tree")
    eval_queries: int = Field(default=512, ge=8, description="continuation: per tree")
    val_queries: int = Field(
        default=0,
        ge=0,
        description="continuation only, per tree: the validation "
        "queries of val_closure_error (0: none)",
    )
    parent: Literal["single_key", "prototypes", "lowrank", "mlp", "oracle", "dense"] = "prototypes"
    prototypes: int = Field(default=4, ge=1, le=64, description="m, for prototypes and lowrank")
    rank: int = Field(default=16, ge=1, description="lowrank: width of the per-node coefficients")
    mlp_match_prototypes: int = Field(
        default=8, ge=1, description="mlp: match this m's parameter count"
    )
    mlp_hidden: int | None = Field(
        default=None,
        ge=1,
        description="mlp: hidden width, its node state width then solved for the parameter match "
        "(None: 32, halved while the match cannot afford it); other parents ignore it",
    )
    mlp_residual: bool = Field(
        default=False,
        description="mlp: add q . e_p[:d] / sqrt(d), the node state's first d numbers read as a "
        "key, so the MLP corrects one key per node and can represent single_key exactly",
    )
    topology: Literal["positional", "random", "learned", "kmeans"] = "learned"
    read: Literal["soft", "beam", "drilldown", "fast_beam"] = "soft"
    beam_width: int | None = Field(default=None, ge=1, description="None: calibrate on fit queries")
    target_recall: float = Field(default=0.95, gt=0, le=1)
    calibration_queries: int = Field(
        default=256, ge=8, description="fit queries the beam is calibrated on"
    )
    drill_tolerance: float = Field(default=0.01, ge=0, lt=0.5)
    max_frontier: int = Field(default=1024, ge=1)
    lr: float = Field(default=0.02, gt=0)
    weight_decay: float = Field(
        default=0.0,
        ge=0,
        description="mlp: decoupled weight decay (AdamW) on the shared MLP's weight matrices, "
        "shrinking its correction; 0: plain Adam",
    )
    batch: int = Field(default=256, ge=1, description="fit queries per Adam step")
    timing_repeats: int = Field(default=5, ge=1)
    oracle_mass: bool = Field(
        default=False,
        description="also report oracle_mass_top_{half,quarter}_at_depth_t and "
        "mass_kept_vs_oracle_top_{half,quarter}_at_depth_t (see oracle_mass_metrics)",
    )
    topology_mass: bool = Field(
        default=False,
        description="also report own_oracle_mass_*, random_tree_mass_* and gap_closed_* per share "
        "and resolution depth (see topology_mass_metrics)",
    )

    @model_validator(mode="after")
    def _shape(self):
        if self.leaves & (self.leaves - 1):
            raise ValueError(f"leaves must be a power of two, got {self.leaves}")
        if self.teacher_layer is not None and self.teacher_layer >= self.teacher.layers:
            raise ValueError(
                f"teacher_layer must name one of the teacher's layers 0..{self.teacher.layers - 1}, "
                f"got {self.teacher_layer}"
            )
        if self.leaf_set == "context" and self.leaves > self.teacher.max_positions:
            raise ValueError(
                f"a context tree holds one window: leaves <= teacher.max_positions "
                f"({self.teacher.max_positions}), got {self.leaves}"
            )
        if self.query_set == "continuation":
            later = self.teacher.max_positions - self.leaves
            if self.leaf_set != "context":
                raise ValueError(
                    "query_set: continuation reads per-context trees (leaf_set: context)"
                )
            if self.fit_queries + self.val_queries + self.eval_queries > later:
                raise ValueError(
                    f"query_set: continuation has {later} later positions per window "
                    f"(teacher.max_positions - leaves); fit_queries + val_queries + eval_queries "
                    f"must not exceed them, got {self.fit_queries} + {self.val_queries} + "
                    f"{self.eval_queries}"
                )
        elif self.val_queries:
            raise ValueError(
                "val_queries are drawn from the continuation positions (query_set: continuation)"
            )
        if self.parent == "dense" and self.read != "soft":
            raise ValueError("the dense arm has no tree to read cheaply; use read: soft")
        if self.parent == "dense" and self.oracle_mass:
            raise ValueError("oracle_mass measures a tree's pruning read; the dense arm has none")
        if self.parent == "mlp" and self.mlp_hidden is not None:
            internal = self.leaves - 1
            _, hidden = mlp_shape(self, internal, self.teacher.d_k)
            if hidden != self.mlp_hidden:
                raise ValueError(
                    f"mlp_hidden {self.mlp_hidden} cannot be matched to m = "
                    f"{self.mlp_match_prototypes} prototypes' parameters (it leaves no node state)"
                )
        if self.weight_decay and self.parent != "mlp":
            raise ValueError(
                "weight_decay shrinks the MLP parent's shared weights; other parents have none"
            )
        if self.parent == "mlp" and self.mlp_residual:
            state_dim, _ = mlp_shape(self, self.leaves - 1, self.teacher.d_k)
            if state_dim < self.teacher.d_k:
                raise ValueError(
                    f"mlp_residual reads a key of d_k = {self.teacher.d_k} numbers from the node "
                    f"state, which the parameter match leaves at {state_dim}"
                )
        if self.read == "fast_beam" and (
            self.leaf_set != "bank" or self.parent not in ("prototypes", "single_key", "lowrank")
        ):
            raise ValueError(
                "read: fast_beam reads one bank (leaf_set: bank) with parents linear in the query "
                "(prototypes, single_key or lowrank)"
            )
        return self


def _metrics() -> dict[str, Metric]:
    # test: measured on the evaluation queries, a half of the held-out windows disjoint from the fit
    # queries (the parents are fitted, and the beam calibrated, on the other half). The leaf keys are
    # the same in fit and evaluation: they are what the tree summarises, not a data split.
    # Closure errors are mean squared errors of log-scores (nats^2) and the KLs nats: positive for every
    # fitted parent and right-skewed over seeds (spr096-resolution-v4 proto4: closure_error_level_5
    # 0.00036-0.00059, leaf_kl 0.0029-0.0042), compared by ratios (relative margins): log scale. (The
    # oracle parent, a test fixture no contract runs, gets exactly 0.)
    metrics: dict[str, Metric] = {"closure_error": positive("lower", "test", unit="nats^2")}
    metrics.update(
        {
            f"closure_error_level_{k}": positive("lower", "test", unit="nats^2")
            for k in range(MAX_DEPTH)
        }
    )
    metrics["leaf_kl"] = positive("lower", "test", unit="nats")
    metrics.update(
        {
            f"{kind}kl_at_depth_{t}": positive("lower", "test", unit="nats")
            for kind in ("", "node_")
            for t in range(1, MAX_DEPTH + 1)
        }
    )
    # the pruning read: the dense mass the kept half / quarter of the depth-t nodes hold; nodes kept at
    # random (a tree whose nodes each hold a spread of the query's mass) keep their share, 1/2 or 1/4
    metrics.update(
        {
            f"mass_kept_top_{share}_at_depth_{t}": proportion("higher", "test", chance=kept)
            for share, first, kept in (("half", 1, 0.5), ("quarter", 2, 0.25))
            for t in range(first, MAX_DEPTH + 1)
        }
    )
    # what the best half / quarter of the leaves themselves hold (the pruning read's ceiling: whatever the
    # topology and parents, a read that keeps N/2 or N/4 leaves keeps at most this); at least their share
    metrics["best_mass_top_half"] = Metric("higher", "test", 0.5, 1.0)
    metrics["best_mass_top_quarter"] = Metric("higher", "test", 0.25, 1.0)
    # with oracle_mass (see oracle_mass_metrics): what the oracle's pruning read keeps, the best half /
    # quarter of the depth-t nodes of the key-bisection tree by dense mass (at least their share), and
    # the mass kept relative to it (at most 1 on that tree itself; another topology's may exceed 1)
    metrics.update(
        {
            f"oracle_mass_top_{share}_at_depth_{t}": Metric("higher", "test", kept, 1.0)
            for share, first, kept in (("half", 1, 0.5), ("quarter", 2, 0.25))
            for t in range(first, MAX_DEPTH + 1)
        }
    )
    metrics.update(
        {
            f"mass_kept_vs_oracle_top_{share}_at_depth_{t}": positive("higher", "test")
            for share, first in (("half", 1), ("quarter", 2))
            for t in range(first, MAX_DEPTH + 1)
        }
    )
    # with topology_mass (see topology_mass_metrics): the oracle's pruning read on the arm's own tree
    # (its topology's ceiling), on a random tree of the same keys (what a topology that groups nothing
    # keeps), and the share of the gap from that random tree to the best leaves the arm's read closes
    for share, first, kept in (("half", 1, 0.5), ("quarter", 2, 0.25)):
        for t in range(first, MAX_DEPTH + 1):
            metrics[f"own_oracle_mass_top_{share}_at_depth_{t}"] = Metric(
                "higher", "test", kept, 1.0
            )
            metrics[f"random_tree_mass_top_{share}_at_depth_{t}"] = Metric(
                "higher", "test", kept, 1.0
            )
            metrics[f"gap_closed_top_{share}_at_depth_{t}"] = Metric(
                "higher", "test", None, 1.0, chance=0.0
            )
    # how peaked the dense posterior is (nats over the tree's leaves; log N is uniform): a property of
    # the data regime that a positive control reads, recorded per arm; linear, as it sits away from 0 (no
    # unit: nats, but not to be compared with the KLs, which are on the log scale)
    metrics["dense_entropy"] = nonnegative(
        "lower", "test", "an entropy near log N, at most log N: away from 0, spread symmetric"
    )
    metrics["dense_entropy_ratio"] = proportion("lower", "test")  # dense_entropy / log N
    metrics["teacher_heldout_loss"] = nonnegative(
        "lower", "diagnostic"
    )  # nats per token, of the frozen teacher
    metrics.update({f"topk_recall_{k}": proportion("higher", "test") for k in (1, 5, 10)})
    # the closure error on fit minibatches and on validation queries (for convergence): like closure_error
    metrics["fit_loss"] = positive("lower", "train", unit="nats^2")
    metrics["val_closure_error"] = positive("lower", "validation", unit="nats^2")
    metrics["fit_topk_recall_10"] = proportion(
        "higher", "train"
    )  # the beam calibration's, on fit queries
    metrics["visited_nodes"] = nonnegative(
        "lower", "cost", "an average over queries of a count at most 2N - 1: roughly normal"
    )
    # wall-clock medians and byte accountings: positive, multiplicative (a ratio to the dense read is the
    # question of spr096-read-cost: latency_ms vs dense_latency_ms, one unit)
    metrics.update(
        {name: positive("lower", "cost", unit="ms") for name in ("latency_ms", "dense_latency_ms")}
    )
    metrics.update(
        {
            name: positive("lower", "cost", unit="MB")
            for name in ("peak_mem_mb", "dense_peak_mem_mb")
        }
    )
    metrics["visited_share"] = proportion("lower", "cost")
    metrics["index_bytes_per_key"] = nonnegative(
        "lower", "cost", "a byte accounting fixed by the tree's shape"
    )  # what the read keeps in memory, per leaf key
    metrics["beam_width"] = Metric("lower", "diagnostic", 1.0, None)
    metrics["overflow_share"] = proportion("lower", "diagnostic")
    return metrics


DENSE_READ_METRICS = (
    "topk_recall_1",
    "topk_recall_5",
    "topk_recall_10",
    "visited_nodes",
    "visited_share",
    "latency_ms",
    "dense_latency_ms",
    "peak_mem_mb",
    "dense_peak_mem_mb",
    "index_bytes_per_key",
)


class RelationClosureStudy(Study):
    """SPR-096: parents approximating their leaves' query responses, and the reads they allow."""

    name: ClassVar[str] = "relation_closure"
    Config: ClassVar[type[StudyConfig]] = RelationClosureConfig
    metrics: ClassVar[dict[str, Metric]] = _metrics()
    deterministic: ClassVar[bool] = False  # the seed draws the windows, the queries and the fits
    machine_metrics: ClassVar[frozenset[str]] = frozenset({"latency_ms", "dense_latency_ms"})
    # the parents' Adam fit; the MLP's hidden width at its matched parameter count (other parents
    # ignore it, so a space over both tunes every arm over the same candidates)
    hyperparameters: ClassVar[frozenset[str]] = frozenset({"lr", "mlp_hidden", "weight_decay"})
    # the data: which teacher (its corpus and training, e.g. v1's 400 steps vs v2's 6000), which of its
    # layers, which queries read the trees (v1's held-out windows vs v2's continuation) and which leaves
    # (per-context trees vs one bank). spr096-prototypes-vs-mlp shares v1's regime; read-cost (a bank) does not.
    regime_fields: ClassVar[tuple[str, ...]] = ("teacher", "teacher_layer", "query_set", "leaf_set")

    def reported_metrics(self, config: RelationClosureConfig) -> frozenset[str]:
        """What run() returns for this arm: the dense arm only its read's cost and recall; a tree its soft
        read (resolution depths 1, 2, 4, ..., D; the quarter from depth 2), closure error per parent level,
        val_closure_error with validation queries, and a cheap read's recall and cost."""
        if config.parent == "dense":
            return frozenset(DENSE_READ_METRICS)
        depth = rt.tree_depth(config.leaves)
        names = {
            "fit_loss",
            "teacher_heldout_loss",
            "closure_error",
            "leaf_kl",
            "dense_entropy",
            "dense_entropy_ratio",
            "best_mass_top_half",
            "best_mass_top_quarter",
        }
        names |= {f"closure_error_level_{k}" for k in range(depth)}
        for t in rt.resolution_depths(depth):
            names |= {
                f"kl_at_depth_{t}",
                f"node_kl_at_depth_{t}",
                f"mass_kept_top_half_at_depth_{t}",
            }
            if t >= 2:
                names.add(f"mass_kept_top_quarter_at_depth_{t}")
            for share in ("half", "quarter") if t >= 2 else ("half",):
                if config.oracle_mass:
                    names |= {
                        f"oracle_mass_top_{share}_at_depth_{t}",
                        f"mass_kept_vs_oracle_top_{share}_at_depth_{t}",
                    }
                if config.topology_mass:
                    names |= {
                        f"{kind}_top_{share}_at_depth_{t}"
                        for kind in ("own_oracle_mass", "random_tree_mass")
                    }
                    if t < depth:  # at the leaves every tree keeps the best leaves: no gap
                        names.add(f"gap_closed_top_{share}_at_depth_{t}")
        if config.query_set == "continuation" and config.val_queries:
            names.add("val_closure_error")
        if config.read != "soft":
            names |= {*DENSE_READ_METRICS, "overflow_share"}
            if config.read in ("beam", "fast_beam"):
                names.add("beam_width")
            if config.read == "fast_beam" or (config.read == "beam" and config.beam_width is None):
                names.add("fit_topk_recall_10")  # calibrated on fit queries
        return frozenset(names)

    def metric_range(
        self, metric: str, config: RelationClosureConfig
    ) -> tuple[float | None, float | None]:
        n = config.leaves
        if metric == "visited_nodes":
            return 0.0, float(2 * n - 1)  # the tree's nodes (the dense read: its N leaves)
        if metric == "beam_width":  # calibrated up to N; a width set beyond N is reported as set
            return 1.0, float(max(n, config.beam_width or n))
        if metric == "dense_entropy":
            return 0.0, math.log(n)
        if metric.startswith("mass_kept_vs_oracle_") and config.topology == "learned":
            return 0.0, 1.0  # the oracle reads the same tree: no selection of its nodes keeps more
        return super().metric_range(metric, config)

    def chance(self, metric: str, config: RelationClosureConfig) -> float | None:
        """topk_recall_k: a read returning k leaves at random holds each of the dense top k with
        probability k / N; mass_kept_*: the declared share (nodes kept at random)."""
        if metric.startswith("topk_recall_"):
            return min(1.0, int(metric.rsplit("_", 1)[1]) / config.leaves)
        return super().chance(metric, config)

    def ceiling(self, metric: str, config: RelationClosureConfig) -> Ceiling | None:
        """mass_kept_top_{half,quarter}_at_depth_t keeps N/2 or N/4 leaves, whatever t: no tree keeps more
        dense mass than the N/2 or N/4 leaves of highest dense posterior, which each run reports per seed."""
        if (
            metric.startswith("mass_kept_vs_oracle_")
            and config.topology == "learned"
            and metric in self.reported_metrics(config)
        ):
            return Ceiling(
                "the oracle reads the same tree and keeps the depth-t nodes of highest dense mass, "
                "exactly 1 by definition; no parent's selection of those nodes keeps more",
                value=1.0,
            )
        if metric.startswith("gap_closed_") and metric in self.reported_metrics(config):
            return Ceiling(
                "a read that keeps the best leaves closes the whole gap from the random tree to them",
                value=1.0,
            )
        if metric.startswith("mass_kept_top_") and metric in self.reported_metrics(config):
            share = metric.split("_")[3]  # half / quarter
            return Ceiling(
                f"the pruning read keeps 1/{2 if share == 'half' else 4} of the leaves; no topology or "
                f"parent keeps more dense mass than the best such set of leaves",
                metric=f"best_mass_top_{share}",
            )
        return None

    def check_ready(self, config: RelationClosureConfig) -> str | None:
        from gates.models.corpora import check_source

        return check_source(config.teacher.corpus, kind="text")

    def setup_missing(self, config: RelationClosureConfig) -> str | None:
        from gates.models.teacher import is_cached

        if is_cached(config.teacher):
            return None
        return (
            f"its teacher ({config.teacher.steps} steps) is not trained in this machine's cache; "
            f"training it takes minutes that the run's recorded seconds do not include"
        )

    def setup_seconds(self, config: RelationClosureConfig) -> float | None:
        from gates.models.teacher import training_seconds

        return training_seconds(config.teacher)

    def setup(self, config: RelationClosureConfig) -> None:
        load_or_train(config.teacher, log=lambda line: print(line, file=sys.stderr))

    def param_count(self, config: RelationClosureConfig) -> int:
        """Trainable parameters per tree (the dense arm: none besides the leaf keys it reads)."""
        if config.parent in ("dense", "oracle"):
            return 0
        keys = torch.zeros(1, config.leaves, config.teacher.d_k)
        return rt.parameter_count(make_parent(config, keys, torch.Generator().manual_seed(0)))

    def flops(self, config: RelationClosureConfig) -> int | None:
        """Multiply-adds x 2 to score every node of a tree for one query (the soft read's cost)."""
        d, n = config.teacher.d_k, config.leaves
        per_node = {
            "single_key": d,
            "prototypes": config.prototypes * d,
            "oracle": d,
            "lowrank": config.prototypes * config.rank,
            "dense": 0,
        }
        shared = 0
        if config.parent == "mlp":
            # the node states' share of the hidden layer (W e_p) does not depend on the query and is
            # computed once per fit step; per query: W q once, then per node an add and the output dot
            _, hidden = mlp_shape(config, n - 1, d)
            shared, per_node["mlp"] = d * hidden, 2 * hidden + (d if config.mlp_residual else 0)
        return 2 * (n * d + shared + (n - 1) * per_node[config.parent])

    def run(self, config: RelationClosureConfig, seed: int, reporter: Reporter) -> dict[str, float]:
        seed_everything(seed)
        generator = torch.Generator().manual_seed(seed)
        device = torch.device(resolve_device(config.device))
        # the teacher records on the arm's device; it is trained (once, cached) on the CPU: see teacher_key
        teacher = load_or_train(
            config.teacher, log=lambda line: print(line, file=sys.stderr), device=device.type
        )
        # drawn on the CPU by the seed's generator (the same draws on every device), then moved
        keys, fit_queries, eval_queries, val_queries = (
            None if t is None else t.to(device) for t in draw_data(teacher, config, generator)
        )
        if config.parent == "dense":
            return self._dense(config, keys, eval_queries, reporter)

        # the reference tree of oracle_mass is built from this state, apart (nothing drawn from it)
        reference_state = generator.get_state() if config.oracle_mass else None
        leaf_order = rt.build_topology(config.topology, keys, generator)
        keys_heap = rt.heap_keys(keys, leaf_order)
        parent = make_parent(config, keys_heap, generator)
        probe = eval_queries[..., :PROBE_QUERIES, :]  # either layout: (Q, d) or (T, Q, d)
        budget = reporter.budget

        def validation() -> dict[str, float]:
            return (
                {}
                if val_queries is None
                else {"val_closure_error": closure_error(parent, keys_heap, val_queries)}
            )

        def on_step(step: int, loss: float) -> None:
            if budget.is_eval_step(step) and step < budget.steps:  # the last report comes below
                reporter.report(
                    step,
                    {
                        "fit_loss": loss,
                        "closure_error": closure_error(parent, keys_heap, probe),
                        **validation(),
                    },
                )

        losses = rt.fit_parents(
            parent,
            keys_heap,
            fit_queries,
            budget.steps,
            config.lr,
            config.batch,
            generator,
            on_step=on_step,
            weight_decay=config.weight_decay,
        )
        metrics = {
            "fit_loss": losses[-1] if losses else 0.0,
            "teacher_heldout_loss": teacher.meta["heldout_loss"],
            **validation(),
        }
        metrics.update(rt.soft_read_metrics(parent, keys_heap, eval_queries))
        metrics["dense_entropy_ratio"] = metrics["dense_entropy"] / math.log(config.leaves)
        if config.oracle_mass:
            if config.topology == "learned":
                reference_order = leaf_order
            else:  # the tree a learned arm of this seed reads: the same draws from the same state
                apart = torch.Generator().set_state(reference_state)
                reference_order = rt.build_topology("learned", keys, apart)
            metrics.update(
                oracle_mass_metrics(metrics, rt.heap_keys(keys, reference_order), eval_queries)
            )
        if config.topology_mass:
            shuffles = torch.Generator().manual_seed(RANDOM_TREE_SEED + seed)
            random_heaps = [
                rt.heap_keys(keys, rt.build_topology("random", keys, shuffles))
                for _ in range(RANDOM_TREES)
            ]
            metrics.update(topology_mass_metrics(metrics, keys_heap, random_heaps, eval_queries))
        if config.read != "soft":
            metrics.update(cheap_read(config, parent, keys_heap, fit_queries, eval_queries))
        reporter.report(budget.steps, metrics)
        return metrics

    def _dense(self, config, keys, eval_queries, reporter) -> dict[str, float]:
        """The reference arm: every leaf read exactly (recall 1 by definition), timed."""
        latency = rt.time_read(lambda: rt.dense_read(keys, eval_queries), config.timing_repeats)
        read = rt.dense_read(keys, eval_queries)
        n = config.leaves
        metrics = {
            "topk_recall_1": 1.0,
            "topk_recall_5": 1.0,
            "topk_recall_10": 1.0,
            "visited_nodes": float(n),
            "visited_share": 1.0,
            "latency_ms": latency,
            "dense_latency_ms": latency,
            "peak_mem_mb": read.read_bytes / 1e6,
            "dense_peak_mem_mb": read.read_bytes / 1e6,
            "index_bytes_per_key": keys.element_size() * keys.shape[2],
        }
        reporter.report(reporter.budget.steps, metrics)
        return metrics


def make_parent(
    config: RelationClosureConfig, keys_heap: torch.Tensor, generator: torch.Generator
) -> rt.Parent:
    if config.parent == "mlp":
        state_dim, hidden = mlp_shape(config, keys_heap.shape[1] - 1, keys_heap.shape[2])
        return rt.make_parent(
            "mlp",
            keys_heap,
            generator,
            state_dim=state_dim,
            hidden=hidden,
            residual=config.mlp_residual,
        )
    return rt.make_parent(
        config.parent, keys_heap, generator, m=config.prototypes, rank=config.rank
    )


def mlp_shape(config: RelationClosureConfig, internal: int, d: int) -> tuple[int, int]:
    """(state_dim, hidden) of the MLP parent matched to prototypes m = mlp_match_prototypes:
    m x (d key entries + 1 log weight) parameters per internal node. The hidden width starts at
    mlp_hidden (None: 32) and is halved while the match cannot afford it."""
    target = internal * config.mlp_match_prototypes * (d + 1)
    if config.mlp_hidden is None:
        return rt.mlp_shape_matching(target, internal, d)
    return rt.mlp_shape_matching(target, internal, d, hidden=config.mlp_hidden)


class Drawn(NamedTuple):
    keys: torch.Tensor  # (T, N, d)
    fit_queries: torch.Tensor  # (Q, d) shared by every tree, or (T, Q, d) per tree (continuation)
    eval_queries: torch.Tensor
    val_queries: torch.Tensor | None  # continuation with val_queries > 0 only


def draw_data(teacher, config: RelationClosureConfig, generator: torch.Generator) -> Drawn:
    """The seed's leaves and queries (see the module docstring)."""
    if config.query_set == "continuation":
        return continuation_data(teacher, config, generator)
    query_window = min(QUERY_WINDOW, teacher.config.max_positions)
    heldout_windows = teacher.stream("heldout").numel() // query_window
    queries, _ = teacher.record("heldout", heldout_windows, query_window, config.teacher_layer)
    shuffled = queries[torch.randperm(len(queries), generator=generator)]
    half = len(shuffled) // 2
    fit_pool, eval_pool = shuffled[:half].flatten(0, 1), shuffled[half:].flatten(0, 1)
    for pool, wanted, name in (
        (fit_pool, config.fit_queries, "fit"),
        (eval_pool, config.eval_queries, "eval"),
    ):
        if len(pool) < wanted:
            raise ValueError(
                f"the held-out slice has {len(pool)} {name} queries, fewer than {wanted}"
            )
    fit_queries = fit_pool[torch.randperm(len(fit_pool), generator=generator)[: config.fit_queries]]
    eval_queries = eval_pool[
        torch.randperm(len(eval_pool), generator=generator)[: config.eval_queries]
    ]

    if config.leaf_set == "context":
        pool_windows = min(CONTEXT_POOL, teacher.stream("train").numel() // config.leaves)
        _, window_keys = teacher.record("train", pool_windows, config.leaves, config.teacher_layer)
        keys = window_keys[torch.randperm(pool_windows, generator=generator)[: config.trees]]
    else:
        # a pool of 4x the windows one bank needs: seeds draw different keys from it
        bank_window = min(BANK_WINDOW, teacher.config.max_positions)
        windows = min(
            teacher.stream("train").numel() // bank_window, 4 * -(-config.leaves // bank_window)
        )
        _, window_keys = teacher.record("train", windows, bank_window, config.teacher_layer)
        pooled = window_keys.flatten(0, 1)
        if len(pooled) < config.leaves:
            raise ValueError(
                f"the training slice has {len(pooled)} keys, fewer than {config.leaves} leaves"
            )
        keys = pooled[torch.randperm(len(pooled), generator=generator)[: config.leaves]].unsqueeze(
            0
        )
    return Drawn(keys.contiguous(), fit_queries.contiguous(), eval_queries.contiguous(), None)


def continuation_data(teacher, config: RelationClosureConfig, generator: torch.Generator):
    """Per-context trees read by their own window's later positions (see the module docstring)."""
    window = teacher.config.max_positions
    pool_windows = min(CONTEXT_POOL, teacher.stream("train").numel() // window)
    queries, window_keys = teacher.record("train", pool_windows, window, config.teacher_layer)
    chosen = torch.randperm(pool_windows, generator=generator)[: config.trees]
    later = config.leaves + torch.randperm(window - config.leaves, generator=generator)
    fit_positions, eval_positions, val_positions = later.split(
        [config.fit_queries, config.eval_queries, config.val_queries]
    )[:3]
    own = queries[chosen]
    return Drawn(
        window_keys[chosen, : config.leaves].contiguous(),
        own[:, fit_positions].contiguous(),
        own[:, eval_positions].contiguous(),
        own[:, val_positions].contiguous() if config.val_queries else None,
    )


def closure_error(parent: rt.Parent, keys_heap: torch.Tensor, queries: torch.Tensor) -> float:
    with torch.no_grad():
        return float((parent(queries) - rt.closure_targets(keys_heap, queries)).pow(2).mean())


def oracle_mass(scores: torch.Tensor, num_nodes: int, keep: int) -> torch.Tensor:
    """The oracle's pruning read at depth t (num_nodes = 2^t nodes): the dense posterior mass of the
    `keep` depth-t nodes that hold the most of it, (T, Q). `scores` (T, Q, N) are the leaf scores in
    the heap order of the tree whose nodes are ranked. It is rt.mass_kept with the tree posterior
    replaced by the exact one (a parent that scores every node by its exact response, `oracle`,
    selects exactly these nodes), so on the same tree mass_kept <= oracle_mass for every query."""
    nodes = scores.softmax(dim=-1).unflatten(-1, (num_nodes, -1)).sum(dim=-1)
    return nodes.topk(keep, dim=-1).values.sum(dim=-1)


def oracle_mass_metrics(
    metrics: dict[str, float], reference_heap: torch.Tensor, queries: torch.Tensor, chunk: int = 128
) -> dict[str, float]:
    """The pruning read against the oracle's, per resolution depth t and share (half: t >= 1,
    quarter: t >= 2), on the evaluation queries:

    - oracle_mass_top_{share}_at_depth_t: the mean over trees and queries of oracle_mass on the
      reference tree, the key-bisection tree of these keys (`topology: learned`, built from the
      generator state the arm's own topology starts from: the tree a learned arm of the seed reads);
    - mass_kept_vs_oracle_top_{share}_at_depth_t = mass_kept_top_{share}_at_depth_t (the arm's
      own read, from `metrics`) / oracle_mass_top_{share}_at_depth_t: a ratio of the two means.

    On a learned tree the reference is the tree itself: the ratio is at most 1 and exact parents
    reach 1. For another topology the denominator is the same number, so its ratio is its absolute
    mass kept on the same scale as the learned tree's (it may exceed 1)."""
    out = {}
    for (share, t), mean in oracle_masses(reference_heap, queries, chunk).items():
        out[f"oracle_mass_top_{share}_at_depth_{t}"] = mean
        kept = metrics[f"mass_kept_top_{share}_at_depth_{t}"]
        out[f"mass_kept_vs_oracle_top_{share}_at_depth_{t}"] = kept / mean
    return out


def oracle_masses(
    heap: torch.Tensor, queries: torch.Tensor, chunk: int = 128
) -> dict[tuple[str, int], float]:
    """(share, t) -> the mean over trees and queries of `oracle_mass` on this tree (`heap`, its keys
    in heap order), for every resolution depth t and share (half: t >= 1, quarter: t >= 2)."""
    depth = rt.tree_depth(heap.shape[1])
    sums: dict[tuple[str, int], float] = {}
    with torch.no_grad():
        for q in rt.query_chunks(queries, chunk):
            scores = rt.leaf_scores(heap, q)
            for t in rt.resolution_depths(depth):
                for share, keep in (("half", 2**t // 2), ("quarter", 2**t // 4)):
                    if keep:
                        total = float(oracle_mass(scores, 2**t, keep).double().sum())
                        sums[share, t] = sums.get((share, t), 0.0) + total
    count = heap.shape[0] * queries.shape[-2]
    return {key: total / count for key, total in sums.items()}


def topology_mass_metrics(
    metrics: dict[str, float], own_heap: torch.Tensor, random_heaps: list[torch.Tensor], queries
) -> dict[str, float]:
    """Where a topology's pruning read stands between grouping nothing and the best leaves, per
    resolution depth t and share, on the evaluation queries (each a mean over trees and queries):

    - own_oracle_mass_top_{share}_at_depth_t: the oracle's pruning read on the arm's own tree (exact
      node masses rank its depth-t nodes): the most any parents on this topology keep, its ceiling;
    - random_tree_mass_top_{share}_at_depth_t: the mean of the oracle's pruning read over random
      trees of the same keys (`random_heaps`, the same trees for every arm of a seed): on average at
      least what fitted parents on a random tree keep;
    - gap_closed_top_{share}_at_depth_t for t < D = (mass_kept - random_tree_mass) /
      (best_mass_top_{share} - random_tree_mass), with the arm's own mass_kept_top_{share}_at_depth_t:
      the share of the gap from a random tree to the best N/2 or N/4 leaves (any read's ceiling) the
      arm's read closes; at most 1 (at the leaves, t = D, every tree keeps the best leaves: no gap).
      Taking random trees' oracle rather than fitted parents on them makes the gap the arm must close
      smaller on average, and so the share it closes smaller: conservative for a claim that a
      topology closes much of it."""
    own = oracle_masses(own_heap, queries)
    shuffled = [oracle_masses(heap, queries) for heap in random_heaps]
    depth = rt.tree_depth(own_heap.shape[1])
    out = {}
    for (share, t), ceiling in own.items():
        suffix = f"top_{share}_at_depth_{t}"
        floor = sum(masses[share, t] for masses in shuffled) / len(shuffled)
        out[f"own_oracle_mass_{suffix}"] = ceiling
        out[f"random_tree_mass_{suffix}"] = floor
        if t < depth:
            best = metrics[f"best_mass_top_{share}"]
            out[f"gap_closed_{suffix}"] = (metrics[f"mass_kept_{suffix}"] - floor) / (best - floor)
    return out


def cheap_read(
    config: RelationClosureConfig, parent, keys_heap, fit_queries, eval_queries
) -> dict[str, float]:
    """A beam, drill-down or fast read on evaluation queries: recall, visited nodes, latency against the
    dense read timed in the same process, the bytes each read holds and its index bytes per key."""
    metrics: dict[str, float] = {}
    index_bytes = sum(t.numel() * t.element_size() for t in (*parent.parameters(), keys_heap))
    if config.read == "fast_beam":
        calibration = tr.calibrate(
            tr.TreeIndex(parent, keys_heap),
            fit_queries[: config.calibration_queries],
            config.target_recall,
        )
        schedule = calibration.schedule
        index = tr.TreeIndex(
            parent, keys_heap, max_depth=schedule.scan_depth
        )  # the parents it reads
        metrics["fit_topk_recall_10"] = calibration.fit_recall
        metrics["beam_width"] = float(tr.kept_per_depth(schedule)[-1])  # nodes scanned per query
        index_bytes = index.nbytes()
        read = lambda: tr.fast_read(index, eval_queries, schedule)  # noqa: E731
    elif config.read == "beam":
        width = config.beam_width
        if width is None:
            # on a subset of the fit queries, the width bisected to within 1/32: wide beams are slow
            width, fit_recall = rt.calibrate_beam(
                parent,
                keys_heap,
                fit_queries[: config.calibration_queries],
                config.target_recall,
                relative_precision=1 / 32,
            )
            metrics["fit_topk_recall_10"] = fit_recall
        metrics["beam_width"] = float(width)
        read = lambda: rt.beam_read(parent, keys_heap, eval_queries, width)  # noqa: E731
    else:
        read = lambda: rt.drilldown_read(  # noqa: E731
            parent,
            keys_heap,
            eval_queries,
            config.drill_tolerance,
            config.max_frontier,
        )
    with torch.inference_mode():
        result = read()
        dense_top = rt.dense_topk(keys_heap, eval_queries, 10)
    metrics.update(rt.cheap_read_metrics(result, dense_top, config.leaves))
    metrics["overflow_share"] = result.overflow / result.visited.numel()
    metrics["latency_ms"] = rt.time_read(read, config.timing_repeats)
    metrics["dense_latency_ms"] = rt.time_read(
        lambda: rt.dense_read(keys_heap, eval_queries), config.timing_repeats
    )
    metrics["peak_mem_mb"] = metrics.pop("read_bytes") / 1e6
    metrics["index_bytes_per_key"] = index_bytes / config.leaves
    metrics["dense_peak_mem_mb"] = rt.dense_read(keys_heap, eval_queries).read_bytes / 1e6
    return metrics
