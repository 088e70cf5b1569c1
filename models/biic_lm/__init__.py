"""BIIC and SFE (seed 004): two registered studies, `biic_lm` (small causal LMs) and `biic_algebra`
(the seed's algebra gates), kept as nanoGPT keeps model.py apart from train.py:

- `gates.models.biic_lm.model`: the language models (BiicLM, SFELM, bif_lm's transformer as the
  `transformer` arm), the rotor maths and the FLOP accounting;
- `gates.models.biic_lm.study`: the configs, the data, the training loop, the metrics and the two
  Study classes (the entry points).

The names below are re-exported here so that `from gates.models.biic_lm import X` works for both.
"""

from gates.models.biic_lm.model import (
    BIIC_ARMS,
    GP_MACS,
    SFE_ARMS,
    SFELM,
    BiicLM,
    biic_window_macs,
    build_model,
    forward_flops,
    rotor_powers,
    sandwich_cost,
    sandwich_matrix,
    transformer_config,
    transformer_mlp_hidden_to_match,
)
from gates.models.biic_lm.study import (
    BiicAlgebraConfig,
    BiicAlgebraStudy,
    BiicLMConfig,
    BiicLMStudy,
    alpha_cos,
    diversity_loss,
    mean_pairwise_cosine,
    occurrence_index,
    tracked_tokens,
)

__all__ = [
    "BIIC_ARMS",
    "GP_MACS",
    "SFE_ARMS",
    "SFELM",
    "BiicAlgebraConfig",
    "BiicAlgebraStudy",
    "BiicLM",
    "BiicLMConfig",
    "BiicLMStudy",
    "alpha_cos",
    "biic_window_macs",
    "build_model",
    "diversity_loss",
    "forward_flops",
    "mean_pairwise_cosine",
    "occurrence_index",
    "rotor_powers",
    "sandwich_cost",
    "sandwich_matrix",
    "tracked_tokens",
    "transformer_config",
    "transformer_mlp_hidden_to_match",
]
