"""The TreeHeap translator (seed 001, stage D of seed 000): one registered study,
`treeheap_translator`, kept as nanoGPT keeps model.py apart from train.py:

- `gates.models.treeheap_translator.model`: the Translator (WRITE, Butterfly, FOLD, READ, GRU and the
  dense baselines), greedy and beam decoding, the FLOP count and the parameter parts;
- `gates.models.treeheap_translator.study`: the config, the data, the training loop, the metrics and
  the Study class (the entry point).

Arm `factorial` (issue #31) crosses an `encoder` (butterfly, butterfly_relay, bigru, transformer2)
with a `reader` (lifting, all_nodes, mha); see the model module. Its names (ENCODERS, READERS, FITS,
WIDTH_OF_ENCODER, ...) are imported from the model module itself.

The names below are re-exported here so that `from gates.models.treeheap_translator import X` works
for both.
"""

from gates.models.treeheap_translator.model import (
    DENSE_ARMS,
    FOLD_ARMS,
    INTERVENTIONS,
    READER_ARMS,
    TREE_ARMS,
    Decoded,
    Fused,
    Translator,
    forward_flops,
    matched_width,
    parameter_parts,
    token_nll,
    translate,
)
from gates.models.treeheap_translator.study import (
    TranslatorConfig,
    TranslatorStudy,
    applicable_interventions,
    bleu_chrf,
    learning_rate,
    load_data,
    mean_nll,
    same_direction_roll,
    unfold_mse,
)

__all__ = [
    "DENSE_ARMS",
    "FOLD_ARMS",
    "INTERVENTIONS",
    "READER_ARMS",
    "TREE_ARMS",
    "Decoded",
    "Fused",
    "Translator",
    "TranslatorConfig",
    "TranslatorStudy",
    "applicable_interventions",
    "bleu_chrf",
    "forward_flops",
    "learning_rate",
    "load_data",
    "matched_width",
    "mean_nll",
    "parameter_parts",
    "same_direction_roll",
    "token_nll",
    "translate",
    "unfold_mse",
]
