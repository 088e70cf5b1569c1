"""treeheap-gates: falsification-gated experiments for TreeHeap research.

`gates` is the platform (contracts, runner, stop rules, verdicts, evidence). It never imports torch
at module level: studies in `models/` do the training and talk to the platform only through a
`gates.study.Reporter`.
"""

__version__ = "0.1.0"
