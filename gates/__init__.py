"""treeheap-gates: falsification-gated experiments for TreeHeap research.

`gates` is the platform, in layers (docs/architecture.md): `gates.study` (the API studies implement),
`gates.contract`, `gates.inference` (the verdict engine), `gates.design` (design rules),
`gates.record` (MLflow, evidence, the claims history), `gates.execution` (the plan and its
executors), `gates.verify` (every claim's check) and `gates.cli`. It never imports torch at module
level: the studies (`gates.models`) do the training and talk to the platform only through a
`gates.study.Reporter`.
"""

import os as _os

__version__ = "0.1.0"

# MKL's AVX-512 kernels round differently from its AVX2 ones, and training amplifies the difference:
# C05's path_only/seed 1, recorded at val_acc 0.265, re-ran at 0.175 on a CPU with AVX-512 and at
# 0.265 with MKL held to AVX2. So every run computes on MKL's AVX2 path, whichever x86 CPU it is on
# (docs/gpu.md#determinism). Set on import of gates, before a study first calls MKL; a value already
# in the environment (a user's choice) wins.
_os.environ.setdefault("MKL_ENABLE_INSTRUCTIONS", "AVX2")
