"""The BIIC and SFE language models of the biic_lm study (seed 004): the modules, the rotor maths and
the FLOP accounting. The configs, data, training loop, metrics and the two studies:
gates.models.biic_lm.study.

Roads and arms (`arm`; d = the LM width, V = vocab_size, T = seq_len, L = layers):

    biic          token state: C = channels multivectors of Cl(4,1), h in R^{T x C x 32}, d = 32 C.
                  h_0 = E[x_t] + P[t]                   E in R^{V x C x 32}, P in R^{T x C x 32}
                  L blocks, each (GN = per-grade RMS norm, below):
                      z = GN(h);  q, k, v = W^k_q z, W^k_k z, W^k_v z     channel maps per grade k
                      token mixing with relative rotor transport, per channel c:
                          u_i = sum_{j <= i} softmax_j(q_i . k_j / sqrt(32 C / H)) R_c^(i-j) v_j R_c^(i-j)~
                          R_c^t = exp(t B_c): a learned bivector B_c (all 10 planes of Cl(4,1),
                          |B_c| clamped to rotor_clamp), so the transform between two tokens is a
                          sandwich by a rotor of their distance (the seed's "sandwich R x R~ as the
                          token-to-token transform"); computed exactly as R^i (sum_j a_ij R^-j v_j R^j) R^-i
                          (R^(i-j) = R^i R^-j: rotors of one bivector commute), 2 sandwiches per
                          token and channel instead of one per token pair
                      h = h + W^k_o u
                      z = GN(h);  m = W^k_1 z (M = mlp_channels multivectors);  h = h + W^k_2 (m sigma(<m>_0))
                      (the gate sigma(<m>_0) reads the rotor-invariant scalar part: on grade 0 the
                      MLP is exactly a SiLU MLP, on grades 1-5 a gated equivariant map)
                  logits = flatten(GN(h_L)) E_flat^T (tied)
                  What the structure guarantees: every sandwich preserves grades and fixes grade 0
                  (the seed's invariant); the channel maps act per grade and so commute with any
                  grade-preserving map applied alike to every channel; grades meet only through
                  scalars (the attention weights, which read all grades, and the MLP gate, which
                  reads grade 0). Under one global rotor S applied to every state, the channel maps,
                  the gate, GN and the scores commute with S when S is in Spin(4) (e1..e4 planes,
                  orthogonal on each grade's coefficients), but the transport by the learned R_c does
                  not unless S commutes with every B_c: like RoPE's rotations, the learned rotors fix
                  a frame. GN divides a grade's block by its RMS, the seed's per-grade normalisation
                  (boosts, the e5 planes, do not preserve the Euclidean norm: the clamp bounds them).
    grade0_only   the biic model and weights, with grades 1-5 masked to 0 after the embedding and after
                  every block: the state is C scalars per token. Every map above sends a state with
                  grades 1-5 at 0 to one with grades 1-5 at 0 (a sandwich fixes scalars), so the
                  equivariant part is removed and nothing else (same parameters, same code path).
    scalar_wide   the same state width with no equivariant part: each of the 32 C numbers of a token is a
                  scalar (an invariant), i.e. grade0_only's network run on every blade slot instead of
                  on the scalar blade alone. Concretely the biic model with (1) no rotor transport (a
                  sandwich fixes scalars: the identity; no bivector parameters) and (2) the MLP gate
                  reading each coordinate itself (m sigma(m): a SiLU MLP, as on grade 0), with the same
                  weight sharing as biic (one C x C channel map per blade group, so the same parameter
                  count less the L x C x 32 bivectors: 266,616 vs 266,872 at the contracts' sizes) and the
                  same per-group RMS norm, embedding, tied head and attention scores. So only what
                  makes grades 1-5 equivariant (the rotor transport between tokens, the invariant-only
                  gate) is removed; the width (128 numbers per token) and the parameters stay.
    transformer   models.bif_lm's `baseline` (embedding + L standard pre-norm blocks, tied head) at
                  width d_model, its mlp_hidden chosen in the contract to match biic's parameters
                  (`transformer_mlp_hidden_to_match`, bif_lm's mlp_hidden_to_match).
    sfe_v10       e_i = (alpha_static_i + g(ctx_i)) B, alpha in R^k (k = alpha_dim = 64), B in R^{k x d};
    sfe_v11       ctx_i = the static embeddings alpha_static_j B of the previous `context` = 4 positions
                  j = i-1..i-4 (zeros before the window's start; detached, the seed's leak fix: position
                  i never reads itself); g: one linear map R^{4d} -> R^k with bias (the author's).
                  h_0 = e_i + P[i], then L standard blocks (bif_lm's Block), logits = LN(h_L) W_out
                  (an untied head, the author's). B ~ N(0, basis_std^2) (default 1 / k, so alpha B
                  starts at an embedding's scale; the author's code 0.02^2). v1.0: g initialised to zero.
                  v1.1: g ~ N(0, 0.001^2),
                  its learning rate g_lr_multiplier (10) x the schedule's, and an auxiliary loss
                  aux_weight (0.01) x the mean pairwise cosine of the dynamic alphas of each tracked
                  token's occurrences in the batch (the seed's "explicit differentiation loss"; the
                  author's code computed it under no_grad, so it had no gradient there; here it does).

FLOP accounting (`forward_flops`, per training token, forward, 2 x multiply-adds of the matmuls and
geometric products as executed; attention's O(T) parts counted for a full row of T keys as bif_lm
does; norms, softmax, gates, embedding lookups and gathers not counted). One geometric product as
executed (models.clifford.gp: a 32 x 32 gather and matvec) is 1024 multiply-adds whatever the
operands' grades. biic per layer and token: channel maps 4 x 32 C^2 (q, k, v, o) + 2 x 32 C M (MLP),
scores T x 32 C, mixing T x 32 C, transport 2 x C x 1024 (two 32 x 32 sandwich matrices applied per
channel); per window and layer, shared by the batch_size windows of a step and divided over their
T x batch_size tokens: the rotor's exp (15 products) and powers (log2 T doubling rounds) and the
2 T C sandwich matrices (32^3 each) (`biic_window_macs`); head 32 C V.
The per-pair sandwich figure of gate 1 (`sandwich_cost`, BiicAlgebraStudy): the multiply-adds of
transporting one token state (C = d / 32 channels) by one sandwich, against one attention score
q.k at width d. Accountings: `executed` 2 x 1024 per channel -> 2048 C / 32 C = 64x whatever d;
`sparse_even` (a rotor has only its 16 even blades: 2 x 16 x 32 per channel) -> 32x; `dense` (the
literal 32^3 contraction over the rotor's 16 even blades, zeros included: 2 x 16 x 32 x 32) -> 1024x
(2048x with all 32 blades of both operands); `executed_exp` adds a 16-term Taylor series per pair
(15 products per channel) -> 64 + 480 = 544x. None gives the seed's "about 360x" (the seed does not
say how it counted).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn

from gates.models import clifford as cl
from gates.models.bif_lm import BifLM, BifLMConfig, Block, causal_mix, mlp_hidden_to_match
from gates.models.bif_lm import forward_flops as transformer_forward_flops

if TYPE_CHECKING:  # annotations only: the config lives with the study
    from gates.models.biic_lm.study import BiicLMConfig

Arm = Literal["biic", "grade0_only", "scalar_wide", "transformer", "sfe_v10", "sfe_v11"]
BIIC_ARMS = ("biic", "grade0_only", "scalar_wide")
SFE_ARMS = ("sfe_v10", "sfe_v11")
ALPHA_STD = (
    0.02  # initial scale of the static recipes alpha (bif_lm's choice: an embedding table's)
)
G_INIT_STD_V11 = 0.001  # the author's v1.1 initialisation of g
GP_MACS = cl.N_BLADES * cl.N_BLADES  # one geometric product as executed by clifford.gp


def transformer_config(config: BiicLMConfig) -> BifLMConfig:
    """bif_lm's baseline at this config's sizes (the transformer arm is that model)."""
    return BifLMConfig(
        arm="baseline",
        corpus=config.corpus,
        vocab_size=config.vocab_size,
        train_fraction=config.train_fraction,
        seq_len=config.seq_len,
        d_model=config.d_model,
        layers=config.layers,
        heads=config.heads,
        mlp_hidden=config.mlp_hidden,
        batch_size=config.batch_size,
        lr=config.lr,
        warmup_steps=config.warmup_steps,
        min_lr_ratio=config.min_lr_ratio,
        weight_decay=config.weight_decay,
        device=config.device,
    )


# ------------------------------------------------------------------------------------ biic model
GRADE_INDEX = torch.tensor(cl.GRADES)  # grade of each blade
GRADE0_MASK = (GRADE_INDEX == 0).float()  # 1 on the scalar blade, 0 on grades 1-5


class GradeLinear(nn.Module):
    """A channel map per grade: y[c, blade] = sum_c' W[grade(blade), c, c'] x[c', blade].

    Commutes with every grade-preserving map acting on the blade index alike in every channel
    (the sandwich by a rotor): equivariant."""

    def __init__(self, inputs: int, outputs: int, std: float):
        super().__init__()
        self.weight = nn.Parameter(std * torch.randn(cl.N_VECTORS + 1, outputs, inputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        per_blade = self.weight[GRADE_INDEX.to(x.device)]  # (32, out, in)
        return torch.einsum("...cb,boc->...ob", x, per_blade)


class GradeNorm(nn.Module):
    """Per-grade RMS norm: each grade's block (all channels, that grade's blades) divided by its RMS,
    times a learned gain per channel and grade. A zero block stays zero (eps)."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(channels, cl.N_VECTORS + 1))
        self.eps = eps
        sizes = torch.tensor(
            [len(cl.BLADES_OF_GRADE[k]) for k in range(cl.N_VECTORS + 1)], dtype=torch.float32
        )
        self.register_buffer(
            "onehot", F.one_hot(GRADE_INDEX, cl.N_VECTORS + 1).float() / sizes, persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # mean square per grade over its blades and over the channels: (..., 6)
        ms = (x * x).mean(-2) @ self.onehot  # (..., 32) @ (32, 6)
        rms_per_blade = (ms + self.eps).sqrt()[..., GRADE_INDEX.to(x.device)]  # (..., 32)
        gain = self.gain[:, GRADE_INDEX.to(x.device)]  # (C, 32)
        return x / rms_per_blade.unsqueeze(-2) * gain


# LEFT_SIGN[k, j] = sign(j xor k, j): (a x)_k = sum_j a_(j xor k) sign(j xor k, j) x_j
LEFT_SIGN = torch.tensor(
    [[cl.blade_product(j ^ k, j)[0] for j in range(cl.N_BLADES)] for k in range(cl.N_BLADES)]
)


def sandwich_matrix(r: torch.Tensor) -> torch.Tensor:
    """(..., 32) -> (..., 32, 32): the matrix M with M x = r x r~ for every multivector x.

    M = Right(r~) Left(r), where Left(a)[k, j] = a_(j xor k) sign(j xor k, j) (x -> a x) and
    Right(b)[k, i] = sign(i, i xor k) b_(i xor k) (y -> y b): two signed gathers, one 32 x 32 x 32
    product per rotor. Applying M is one matrix-vector product (1024 multiply-adds), a plain batched
    matmul instead of clifford.gp's gather per state (the same numbers up to rounding; tested)."""
    xor = cl.XOR.to(r.device)
    left = r[..., xor] * LEFT_SIGN.to(r.device, r.dtype)  # [k, j]
    rr = cl.reverse(r)
    right = (rr[..., xor] * cl.SIGN_IK.to(r.device, r.dtype)).transpose(-1, -2)  # [i, k] -> [k, i]
    return right @ left


def rotor_powers(bivector: torch.Tensor, length: int, clamp: float, terms: int) -> torch.Tensor:
    """R^t = exp(t B) for t = 0..length-1, per channel: (length, C, 32), from B (C, 32) of grade 2.

    |B| is clamped to `clamp` (the Euclidean norm of its 10 coefficients, scaled down if larger):
    the Taylor series of exp converges fast at small |B| and the boosts (e5 planes) grow at most like
    cosh(t clamp). R^1 = exp_taylor(B, terms); the powers by doubling: log2(length) batched products."""
    norm = bivector.norm(dim=-1, keepdim=True)
    b = bivector * torch.clamp(clamp / (norm + 1e-12), max=1.0)
    r1 = cl.exp_taylor(b, terms)
    powers = cl.one_like(r1).unsqueeze(0)  # (1, C, 32): R^0 = 1
    step = r1
    while powers.shape[0] < length:
        powers = torch.cat(
            [powers, cl.gp(powers, step.unsqueeze(0))], 0
        )  # R^(n..2n-1) = R^(0..n-1) R^n
        step = cl.gp(step, step)
    return powers[:length]


def residual_scale(config: BiicLMConfig) -> float:
    """nanoGPT's 1 / sqrt(2 L) for the maps that write into the residual stream."""
    return 1 / math.sqrt(2 * config.layers)


class RotorAttention(nn.Module):
    """Causal attention whose values travel from j to i by the sandwich R^(i-j) v_j R^(i-j)~ (per channel).

    In grade0_only (`mask` given) the carried values are masked too: a sandwich fixes a scalar up to
    the rotors' rounding (R R~ = 1 + O(float32 eps)), and that rounding must not leave grades 1-5
    nonzero inside the block."""

    def __init__(self, config: BiicLMConfig):
        super().__init__()
        C = config.channels
        self.heads, self.clamp, self.terms = config.heads, config.rotor_clamp, config.exp_terms
        self.q, self.k, self.v = (GradeLinear(C, C, 1 / math.sqrt(C)) for _ in range(3))
        self.o = GradeLinear(C, C, residual_scale(config) / math.sqrt(C))
        self.transport = (
            config.arm != "scalar_wide"
        )  # scalar_wide: every coordinate a scalar, no rotors
        if self.transport:
            self.bivector = nn.Parameter(
                cl.from_grade(0.01 * torch.randn(C, len(cl.BLADES_OF_GRADE[2])), 2)
            )

    def transports(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sandwich matrices of R^t and R^-t, t = 0..length-1: (T, C, 32, 32) each."""
        powers = rotor_powers(
            cl.grade(self.bivector, 2), length, self.clamp, self.terms
        )  # (T, C, 32)
        return sandwich_matrix(powers), sandwich_matrix(cl.reverse(powers))  # R^-t = (R^t)~

    def forward(self, z: torch.Tensor, mask=lambda x: x) -> torch.Tensor:
        B, T, C, _ = z.shape
        q, k, v = self.q(z), self.k(z), self.v(z)
        if self.transport:
            out, home = self.transports(T)
            v_home = mask(
                torch.einsum("tcki,btci->btck", home, v)
            )  # R^-j v_j R^j: each value carried to position 0
        else:
            v_home = v
        H = self.heads
        split = lambda x: x.reshape(B, T, H, -1).transpose(1, 2)  # noqa: E731  (B, H, T, 32 C / H)
        mixed = causal_mix(split(q), split(k), split(v_home), 1 / math.sqrt(q[0, 0].numel() / H))
        u = mixed.transpose(1, 2).reshape(B, T, C, cl.N_BLADES)
        if not self.transport:
            return self.o(u)
        # R^i u_i R^-i = sum_j a_ij R^(i-j) v_j R^(i-j)~
        return self.o(mask(torch.einsum("tcki,btci->btck", out, u)))


class GatedMultivectorMLP(nn.Module):
    def __init__(self, config: BiicLMConfig):
        super().__init__()
        C, M = config.channels, config.mlp_channels
        self.up = GradeLinear(C, M, 1 / math.sqrt(C))
        self.down = GradeLinear(M, C, residual_scale(config) / math.sqrt(M))
        self.scalar = config.arm == "scalar_wide"

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        m = self.up(z)
        if self.scalar:  # every coordinate is a scalar: a SiLU on each
            return self.down(m * torch.sigmoid(m))
        return self.down(m * torch.sigmoid(m[..., :1]))  # the gate reads the invariant scalar part


class BiicBlock(nn.Module):
    def __init__(self, config: BiicLMConfig):
        super().__init__()
        self.attention_norm = GradeNorm(config.channels)
        self.attention = RotorAttention(config)
        self.mlp_norm = GradeNorm(config.channels)
        self.mlp = GatedMultivectorMLP(config)

    def forward(self, h: torch.Tensor, mask=lambda x: x) -> torch.Tensor:
        h = mask(h + self.attention(self.attention_norm(h), mask))
        return mask(h + self.mlp(self.mlp_norm(h)))


class BiicLM(nn.Module):
    """The biic, grade0_only and scalar_wide arms (one model; grade0_only masks grades 1-5, scalar_wide
    drops the rotor transport and gates every coordinate by itself, see the docstring)."""

    def __init__(self, config: BiicLMConfig):
        super().__init__()
        self.config = config
        C, V, T = config.channels, config.vocab_size, config.seq_len
        self.grade0_only = config.arm == "grade0_only"
        self.token_embedding = nn.Parameter(0.02 * torch.randn(V, C, cl.N_BLADES))
        self.position_embedding = nn.Parameter(0.02 * torch.randn(T, C, cl.N_BLADES))
        self.blocks = nn.ModuleList(BiicBlock(config) for _ in range(config.layers))
        self.final_norm = GradeNorm(C)

    def mask(self, h: torch.Tensor) -> torch.Tensor:
        return h * GRADE0_MASK.to(h.device, h.dtype) if self.grade0_only else h

    def states(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) -> final multivector states (B, T, C, 32), normalised."""
        T = tokens.shape[1]
        h = self.mask(self.token_embedding[tokens] + self.position_embedding[:T])
        for block in self.blocks:
            h = block(h, self.mask)
        return self.final_norm(h)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.states(tokens)
        table = self.mask(self.token_embedding)  # grade0_only reads (and writes) grade 0 only
        return h.flatten(-2) @ table.flatten(-2).T


# ------------------------------------------------------------------------------------ SFE model
class SFELM(nn.Module):
    """e_i = (alpha_static_i + g(ctx_i)) B + P[i], L standard blocks, an untied head (see the docstring)."""

    def __init__(self, config: BiicLMConfig):
        super().__init__()
        self.config = config
        V, d, k = config.vocab_size, config.d_model, config.alpha_dim
        block_config = transformer_config(config)  # bif_lm's Block reads d_model, heads, mlp_hidden
        self.alpha = nn.Embedding(V, k)
        std = (
            config.basis_std if config.basis_std is not None else 1 / math.sqrt(k)
        )  # default: alpha B at an
        self.basis = nn.Parameter(
            std * torch.randn(k, d)
        )  # embedding's scale; the author's code: 0.02
        self.g = nn.Linear(config.context * d, k, bias=True)
        self.position_embedding = nn.Embedding(config.seq_len, d)
        self.blocks = nn.ModuleList(Block(block_config) for _ in range(config.layers))
        self.final_norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, V, bias=False)
        residual_std = 0.02 / math.sqrt(2 * config.layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and not name == "g":
                nn.init.normal_(
                    module.weight,
                    std=residual_std if name.endswith(("attention.out", "mlp.down")) else 0.02,
                )
        nn.init.normal_(self.alpha.weight, std=ALPHA_STD)
        nn.init.normal_(self.position_embedding.weight, std=0.02)
        nn.init.zeros_(self.g.bias)
        if config.arm == "sfe_v10":
            nn.init.zeros_(self.g.weight)
        else:
            nn.init.normal_(self.g.weight, std=G_INIT_STD_V11)

    def context(self, alpha_static: torch.Tensor) -> torch.Tensor:
        """(B, T, context d): the static embeddings of positions i-1..i-context, zeros before the start,
        detached (position i never reads itself)."""
        static = (alpha_static @ self.basis).detach()
        B, T, d = static.shape
        c = self.config.context
        padded = torch.cat([static.new_zeros(B, c, d), static], 1)  # padded[c + j] = static[j]
        return torch.cat(
            [padded[:, c - n : c - n + T] for n in range(1, c + 1)], -1
        )  # n-th previous

    def alphas(self, tokens: torch.Tensor) -> torch.Tensor:
        """The dynamic recipes alpha_static + g(ctx): (B, T, k)."""
        alpha_static = self.alpha(tokens)
        return alpha_static + self.g(self.context(alpha_static))

    def forward(self, tokens: torch.Tensor, return_alphas: bool = False):
        alphas = self.alphas(tokens)
        h = alphas @ self.basis + self.position_embedding(
            torch.arange(tokens.shape[1], device=tokens.device)
        )
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.final_norm(h))
        return (logits, alphas) if return_alphas else logits


def build_model(config: BiicLMConfig) -> nn.Module:
    if config.arm in BIIC_ARMS:
        return BiicLM(config)
    if config.arm in SFE_ARMS:
        return SFELM(config)
    return BifLM(transformer_config(config))


# ------------------------------------------------------------------------------------ sizes
def biic_window_macs(config: BiicLMConfig) -> int:
    """Multiply-adds one biic layer spends per window (shared by the batch's windows): the rotor's
    exp (terms - 1 products) and its powers by doubling (a round: one product per power so far and
    one squaring), GP_MACS per product; then the sandwich matrices of R^t and R^-t for every t
    (one 32 x 32 x 32 product each; the gathers cost no arithmetic). Per channel, times C."""
    T, C = config.seq_len, config.channels
    products, n = config.exp_terms - 1, 1
    while n < T:
        products += n + 1
        n *= 2
    return C * (products * GP_MACS + 2 * T * cl.N_BLADES**3)


def forward_flops(config: BiicLMConfig) -> int:
    """Forward FLOPs per training token (2 x multiply-adds), accounted as the module docstring says."""
    if config.arm == "transformer":
        return transformer_forward_flops(transformer_config(config))
    V, T, L = config.vocab_size, config.seq_len, config.layers
    if config.arm in SFE_ARMS:
        d, k, m = config.d_model, config.alpha_dim, config.mlp_hidden
        block = 4 * d * d + 2 * T * d + 2 * d * m
        embed = k * d + config.context * d * k + k * d  # static e for the context, g, (alpha + g) B
        return 2 * (embed + L * block + d * V)
    C, M, S = config.channels, config.mlp_channels, cl.N_BLADES
    maps = 4 * S * C * C + 2 * S * C * M  # q, k, v, o; the MLP's up and down (per blade)
    mixing = 2 * T * S * C  # scores over T keys, mixing T values
    transport = 2 * C * S * S  # two sandwich matrices applied per channel (home, then out)
    window = biic_window_macs(config) / (T * config.batch_size)  # shared over the batch's tokens
    if config.arm == "scalar_wide":  # no rotors
        transport = window = 0
    return int(round(2 * (L * (maps + mixing + transport + window) + S * C * V)))


def transformer_mlp_hidden_to_match(config: BiicLMConfig, target_params: int) -> int:
    """The transformer arm's mlp_hidden at which its parameter count is nearest target_params."""
    return mlp_hidden_to_match(
        transformer_config(config.model_copy(update={"arm": "transformer"})), target_params
    )


def sandwich_cost(d_state: int, accounting: str, exp_terms: int = 16) -> dict:
    """Multiply-adds of transporting one token state (C = d_state / 32 multivectors) by a sandwich,
    against one attention score q.k of width d_state, under an accounting (module docstring)."""
    C = d_state // cl.N_BLADES
    if accounting == "executed":
        macs = C * 2 * GP_MACS
    elif accounting == "executed_exp":  # + the rotor's Taylor series per pair: terms - 1 products
        macs = C * 2 * GP_MACS + C * (exp_terms - 1) * GP_MACS
    else:
        macs = cl.sandwich_flops(
            d_state, channels=C, rotor_even=True, dense_table=accounting == "dense"
        )["sandwich_macs"]
    return {"sandwich_macs": macs, "attention_macs": d_state, "ratio": macs / d_state}
