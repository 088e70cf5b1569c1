"""Studies: the models and protocols that `gates` runs, one readable file per study.

Each study subclasses `gates.study.Study` and is registered by name under the entry-point group
`gates.studies` (see pyproject.toml); contracts name a study, never an import path.

- `c05_probe` (`models.c05_probe.C05ProbeStudy`): does a kernel need the subheap? Scores every
  address of a full binary tree for a planted (root, left, right) pattern, trained on shallow trees
  and tested on deep ones, with four arms: flat_address, path_only, subheap_kernel,
  path_subheap_kernel (seed 002, studies.md section 1).

`models.common` holds what every study shares: seeding, parameter counting, the training loop.
Nothing under `models/` imports mlflow; studies talk to the platform only through a Reporter.
This package module imports nothing so that `import models` stays cheap (no torch).
"""
