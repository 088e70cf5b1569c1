"""One training step of each study profiled in #12, at the settings of its committed contracts, for
`benchmarks/training_throughput.py` (which times them against the code at a baseline commit).

    build_relation_closure_step(threads, device="cpu", variant="proto4")
    build_teacher_step(threads, device="cpu")
    build_bif_lm_step(threads, device="cpu", arm="bif")

each -> (step_fn, units_per_step, unit_name): step_fn() runs one optimizer step on a fixed-size batch.
`STEPS` maps benchmark names to builder(device) -> (step_fn, [units of the last step], unit_name), the
form training_throughput.py's worker reads (it sets the threads itself).

Only public names of the studies that exist before and after #12 are used (where a name is new, the
builder detects it: `device` fields, `bif_lm.optimizer_for`), and every module of the studies comes
through `studies(name)` (`gates.models.<name>`, or `models.<name>` at commits from before the namespace
move), so the same builder runs against the code at 6e708ad and at HEAD. training_throughput.py runs
them in workers that import one commit's clean checkout alone; run directly, this file imports whatever
`gates` resolves to (the editable install):

    python benchmarks/study_steps.py                                   # the installed code

Settings, from contracts/*.yaml:
- relation_closure (spr096-resolution, spr096-topology, spr096-prototypes): the fit of m = 4 prototype
  parents (variant proto4; proto8 / mlp: spr096-prototypes-vs-mlp; bank: spr096-read-cost's 65,536-key
  bank) on 32 per-context trees of 64 teacher keys, 256 fit queries per Adam step, lr 0.02; one step =
  draw the batch, exact closure targets, loss, backward, Adam (models.relation_tree.fit_parents' body).
  Unit: (query, tree) pairs.
- teacher (the relation-closure contracts' `teacher: {steps: 400}`, otherwise TeacherConfig's
  defaults): AdamW on 32 windows of 128 tokens or, every other step, 16 of 256 (the teacher's own
  alternation; 4,096 tokens either way), gradient clipping at 1 (models.teacher.train_teacher's body).
  Unit: tokens. The study trains its teacher on the CPU (one thread) whatever the arm's device; with
  device cuda this is the same step on the GPU, for reference only.
- bif_lm (bif-fam, arm `bif` by default): 12 windows of 128 tokens, AdamW (betas 0.9, 0.95), clipping
  at 1 (BifLMStudy.run's loss_fn + models.common.train_loop's step). Unit: tokens.

The corpora must be fetched (libreoffice-help:en); the teacher of the relation-closure contracts is
trained into the cache first when it is not there (a minute or two, once).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

Step = Callable[[], None]


def studies(module: str):
    """A module of the studies as the code measured names it: `gates.models.<module>` since the studies
    were installed under the platform's namespace, `models.<module>` in a baseline from before (whose
    checkout has no gates/models: training_throughput.py's worker imports one commit's code alone)."""
    import importlib

    try:
        import gates.models  # noqa: F401
    except ImportError:
        return importlib.import_module(f"models.{module}")
    return importlib.import_module(f"gates.models.{module}")


def _threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)


def _with_device(config_class, device: str, **fields):
    """config_class(**fields), with `device` where the code has the field (after #12)."""
    if "device" in config_class.model_fields:
        fields["device"] = device
    elif device != "cpu":
        raise ValueError(f"{config_class.__name__} predates devices: it runs on the CPU only")
    return config_class(**fields)


def _contract_teacher():
    teacher = studies("teacher")

    config = teacher.TeacherConfig(
        steps=400
    )  # `teacher: {steps: 400}` in every relation-closure contract
    return config, teacher.load_or_train(
        config, log=lambda line: print(line, file=sys.stderr)
    )  # the CPU teacher


# ------------------------------------------------------------------------------------ relation closure
RELATION_CLOSURE_VARIANTS = {
    "proto4": dict(
        leaf_set="context",
        leaves=64,
        trees=32,
        parent="prototypes",
        prototypes=4,
        topology="learned",
    ),
    "proto8": dict(
        leaf_set="context",
        leaves=64,
        trees=32,
        parent="prototypes",
        prototypes=8,
        topology="learned",
    ),
    "mlp": dict(
        leaf_set="context",
        leaves=64,
        trees=32,
        parent="mlp",
        mlp_match_prototypes=8,
        topology="learned",
    ),
    "bank": dict(
        leaf_set="bank",
        leaves=65536,
        trees=1,
        fit_queries=1024,
        eval_queries=512,
        parent="prototypes",
        prototypes=4,
        topology="learned",
    ),
}


def build_relation_closure_step(
    threads: int | None = None, device: str = "cpu", variant: str = "proto4"
) -> tuple[Step, int, str]:
    """One Adam step of the parent fit: (step, batch x trees, "query-trees")."""
    rt, rc = studies("relation_tree"), studies("relation_closure")
    seed_everything = studies("common").seed_everything
    RelationClosureConfig, draw_data, make_parent = (
        rc.RelationClosureConfig,
        rc.draw_data,
        rc.make_parent,
    )

    _threads(threads)
    teacher_config, teacher = _contract_teacher()
    config = _with_device(
        RelationClosureConfig, device, teacher=teacher_config, **RELATION_CLOSURE_VARIANTS[variant]
    )
    seed_everything(0)
    generator = torch.Generator().manual_seed(0)
    keys, fit_queries = draw_data(teacher, config, generator)[:2]  # a 3-tuple before Drawn
    keys_heap = rt.heap_keys(keys, rt.build_topology(config.topology, keys, generator)).to(device)
    fit_queries = fit_queries.to(device)
    parent = make_parent(config, keys_heap, generator)
    optimizer = torch.optim.Adam([p for p in parent.parameters() if p.requires_grad], lr=config.lr)
    batch = min(config.batch, fit_queries.shape[-2])
    parent.train()

    def step() -> None:
        _threads(threads)
        rows = torch.randperm(fit_queries.shape[-2], generator=generator)[:batch]
        queries = rt.select_queries(fit_queries, rows.to(device))
        with torch.no_grad():
            target = rt.closure_targets(keys_heap, queries)
        loss = (parent(queries) - target).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, batch * config.trees, "query-trees"


# ------------------------------------------------------------------------------------ teacher
def build_teacher_step(threads: int | None = None, device: str = "cpu") -> tuple[Step, int, str]:
    """One AdamW step of the relation-closure contracts' teacher: (step, 4,096, "tokens")."""
    seed_everything = studies("common").seed_everything
    TeacherLM, sample_windows = studies("teacher").TeacherLM, studies("teacher").sample_windows

    _threads(threads)
    config, teacher = _contract_teacher()
    stream = teacher.stream("train")
    seed_everything(config.seed)
    model = TeacherLM(config, teacher.tokenizer.get_piece_size()).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.99),
    )
    generator = torch.Generator().manual_seed(config.seed)
    long_rows = max(1, config.batch * config.seq_len // config.max_positions)
    count = [0]
    model.train()

    def step() -> None:
        _threads(threads)
        count[0] += 1
        if count[0] % 2 == 0:  # as train_teacher: every other step the longest windows
            inputs, targets = sample_windows(stream, long_rows, config.max_positions, generator)
        else:
            inputs, targets = sample_windows(stream, config.batch, config.seq_len, generator)
        inputs, targets = inputs.to(device), targets.to(device)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step, config.batch * config.seq_len, "tokens"


# ------------------------------------------------------------------------------------ bif_lm
def _bif_fam_arm(arm: str) -> dict:
    from pathlib import Path

    import yaml

    contract = Path(__file__).resolve().parent.parent / "contracts" / "bif-fam.yaml"
    return dict(yaml.safe_load(contract.read_text())["arms"][arm])


def build_bif_lm_step(
    threads: int | None = None, device: str = "cpu", arm: str = "bif"
) -> tuple[Step, int, str]:
    """One AdamW step of a bif-fam arm: (step, batch_size x seq_len, "tokens")."""
    import numpy as np

    bl, seed_everything = studies("bif_lm"), studies("common").seed_everything

    _threads(threads)
    config = _with_device(bl.BifLMConfig, device, **_bif_fam_arm(arm))
    stream = torch.from_numpy(bl.load_token_data(config).train.astype(np.int64)).to(device)
    seed_everything(0)
    model = bl.BifLM(config).to(device)
    if hasattr(bl, "optimizer_for"):  # after #12: the optimizer the study trains with (fused AdamW)
        optimizer = bl.optimizer_for(model, config)
    else:
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay
        )
    generator = torch.Generator().manual_seed(0)
    model.train()

    def step() -> None:
        _threads(threads)
        inputs, targets = bl.sample_windows(stream, config.batch_size, config.seq_len, generator)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step, config.batch_size * config.seq_len, "tokens"


# ------------------------------------------------------------------------------------ for training_throughput.py
def _counted(
    build: Callable[..., tuple[Step, int, str]], **options
) -> Callable[[str], tuple[Step, list, str]]:
    def builder(device: str):
        step, units, unit = build(None, device, **options)
        return step, [units], unit

    return builder


STEPS: dict[str, Callable[[str], tuple[Step, list, str]]] = {
    "relation_closure_proto4": _counted(build_relation_closure_step, variant="proto4"),
    "relation_closure_proto8": _counted(build_relation_closure_step, variant="proto8"),
    "teacher": _counted(build_teacher_step),
    "bif_lm_baseline": _counted(build_bif_lm_step, arm="baseline"),
    "bif_lm_bif": _counted(build_bif_lm_step, arm="bif"),
}


def main() -> int:
    """Smoke run: build every step, run two, print ms per step (no comparison: see training_throughput.py)."""
    import argparse
    import time

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--only", help="comma-separated names of STEPS")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"models from {studies('common').__file__}", file=sys.stderr)
    for name in args.only.split(",") if args.only else STEPS:
        step, counted, unit = STEPS[name](args.device)
        step()
        started = time.perf_counter()
        for _ in range(args.steps):
            step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        ms = 1000 * (time.perf_counter() - started) / args.steps
        print(f"{name:26s} {ms:8.1f} ms/step  {counted[0] / ms * 1000:10.0f} {unit}/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
