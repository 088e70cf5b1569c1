"""treeheap-gates: falsification-gated experiments for TreeHeap research.

`gates` is the platform, in layers (docs/architecture.md): `gates.study` (the API studies implement),
`gates.contract`, `gates.inference` (the verdict engine), `gates.design` (design rules),
`gates.record` (MLflow, evidence, the claims history), `gates.execution` (the plan and its
executors), `gates.verify` (every claim's check) and `gates.cli`. It never imports torch at module
level: the studies (`gates.models`) do the training and talk to the platform only through a
`gates.study.Reporter`.
"""

__version__ = "0.1.0"
