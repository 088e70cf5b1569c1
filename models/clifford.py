"""The geometric algebra Cl(4,1): multivectors, the geometric product, rotors and sandwiches (seed 004, BIIC).

A multivector is a tensor (..., 32): one coefficient per basis blade. Blade i is the bitmask of the
basis vectors it contains (bit 0 = e1 ... bit 4 = e5), so index 0 is the scalar 1, 1 = e1, 3 = e12,
31 = e12345; the grade of blade i is popcount(i). Every function is batched over the leading dims
(broadcasting where two multivectors meet) and works in float32 and float64, on any device.

The metric is (+, +, +, +, -): e1..e4 square to +1, e5 squares to -1. The product of two blades
follows from the bitmask alone:

    e_A e_B = sign(A, B) e_(A xor B)
    sign(A, B) = (-1)^(swaps to sort the concatenated vectors) * prod over shared vectors e_i^2

so the whole algebra is one 32 x 32 table of signs (`CAYLEY_SIGN`), computed once below. The
geometric product is then (out_k = sum_i a_i b_(i xor k) sign(i, i xor k)):

    gp(a, b)[k] = sum_i a_i * sign(i, i ^ k) * b[i ^ k]      (one gather, one batched matmul)

1024 multiply-adds; it materialises a (..., 32, 32) tensor per product (mind memory at LM batch
sizes). `gp_dense` is the literal trilinear form over the 32 x 32 x 32 table (32x the work, the
same numbers), kept as a reference.

Rotors. For a bivector B, R = exp(B) is in Spin+(4,1): R R~ = 1 for *every* bivector (exp(B)~ =
exp(-B)), and x -> R x R~ preserves grades, fixes scalars and is an algebra automorphism
(R a R~ R b R~ = R ab R~). Three evaluations of exp(B):
- `exp_taylor(B, terms)`: sum_{n < terms} B^n / n!, the seed's method (16 terms);
- `exp_scaling_squaring(B)`: exp(B / 2^s)^(2^s) with a 30-term series at |B / 2^s| <= 1/4, an
  independent high-accuracy reference (use float64);
- `exp_closed(B)`: closed forms. A *simple* bivector (B ^ B = 0, e.g. e12 or e15) has B^2 = beta,
  a scalar, and exp(B) = cos(a) + sin(a)/a B (beta = -a^2 < 0, a rotation), cosh(a) + sinh(a)/a B
  (beta = a^2 > 0, a boost: planes containing e5), 1 + B (beta = 0). In five dimensions a generic
  bivector is NOT simple (B^2 has a 4-vector part); it splits into two commuting simple bivectors
  B = B1 + B2 (`split_bivector`, the invariant decomposition), and exp(B) = exp(B1) exp(B2). The
  split divides by the gap between the two invariants B1^2 and B2^2: it is undefined when they are
  equal (e.g. isoclinic rotations like e12 + e34) and ill-conditioned near that.

Norms. The algebra's quadratic form <x x~>_0 is indefinite (e5^2 = -1): per grade it is
`grade_quadratic`, invariant under every rotor but possibly 0 or negative (e.g. e1 + e5 is a null
vector), so it cannot be divided by. The seed's blow-up: boosts (bivectors with an e5 plane) grow
the coefficients like cosh, and after many sandwiches they overflow. `normalize_grades` divides
each grade's block by its Euclidean coefficient norm sqrt(sum of the block's squared coefficients):
positive definite (never 0 or negative except for an empty block, guarded by eps) and it bounds the
growth. It commutes with sandwiches by rotors of the compact subgroup Spin(4) (bivectors in
e1..e4 only: those act orthogonally on every grade's coefficients), NOT with boosts: after a boost,
normalise-then-sandwich != sandwich-then-normalise (the tests measure both). Grade 0 is left alone
by default: normalising it would map every scalar to +-1, and it is the part the sandwich fixes.
Per grade rather than one global scale so that a grade that grows under boosts cannot swamp the
others (a global scale alone commutes with every sandwich, but leaves the grades' ratios free).

Cost (`sandwich_flops`): the multiply-adds of one sandwich R x R~ (two geometric products, counted
from the nonzero entries of the Cayley table restricted to the operands' grades) against one
attention score (a dot product of width d), so a study can report the seed's "about 360x" gate-1
figure from a stated accounting instead of assuming it.
"""

from __future__ import annotations

import math

import torch

N_VECTORS = 5
METRIC = (1, 1, 1, 1, -1)  # e1..e4 square to +1, e5 to -1
N_BLADES = 1 << N_VECTORS  # 32


def _popcount(i: int) -> int:
    return bin(i).count("1")


def blade_product(a: int, b: int) -> tuple[int, int]:
    """e_A e_B = sign * e_(A xor B) for blades given as bitmasks."""
    # Reordering: every vector of A that sits after a vector of B must hop over it once.
    swaps, rest = 0, a >> 1
    while rest:
        swaps += _popcount(rest & b)
        rest >>= 1
    sign = -1 if swaps % 2 else 1
    for i in range(N_VECTORS):  # e_i e_i = metric_i for every vector the two blades share
        if (a & b) >> i & 1:
            sign *= METRIC[i]
    return sign, a ^ b


GRADES = tuple(_popcount(i) for i in range(N_BLADES))
BLADES_OF_GRADE = tuple(
    tuple(i for i in range(N_BLADES) if GRADES[i] == k) for k in range(N_VECTORS + 1)
)
CAYLEY_SIGN = torch.tensor(
    [[blade_product(a, b)[0] for b in range(N_BLADES)] for a in range(N_BLADES)]
)
XOR = torch.tensor([[a ^ b for b in range(N_BLADES)] for a in range(N_BLADES)])
# SIGN_IK[i, k] = sign of e_i e_(i xor k) (the pair whose product lands on blade k).
SIGN_IK = torch.gather(CAYLEY_SIGN, 1, XOR)
SIGNED_XOR = XOR + N_BLADES * (SIGN_IK < 0)  # index into [b, -b]: the sign folded into the gather
# Reverse and grade involution: one sign per grade k, (-1)^(k(k-1)/2) and (-1)^k.
REVERSE_SIGN = torch.tensor([(-1) ** (k * (k - 1) // 2) for k in GRADES])
INVOLUTE_SIGN = torch.tensor([(-1) ** k for k in GRADES])
# <e_A e_A~>_0 = product of the metric over A's vectors: the indefinite quadratic form's diagonal.
QUADRATIC_SIGN = torch.tensor([CAYLEY_SIGN[i, i] * REVERSE_SIGN[i] for i in range(N_BLADES)])

_CACHE: dict = {}


def _table(name: str, like: torch.Tensor) -> torch.Tensor:
    """A constant table in `like`'s dtype (index tables stay long) and device, made once per pair."""
    key = (name, like.dtype, like.device)
    if key not in _CACHE:
        t = globals()[name]
        _CACHE[key] = (
            t.to(like.device) if name in ("XOR", "SIGNED_XOR") else t.to(like.device, like.dtype)
        )
    return _CACHE[key]


def blade_name(i: int) -> str:
    return "1" if i == 0 else "e" + "".join(str(j + 1) for j in range(N_VECTORS) if i >> j & 1)


def blade(*vectors: int, dtype=torch.float64) -> torch.Tensor:
    """The multivector e_{v1} e_{v2} ... (vectors numbered 1..5, any order, repeats allowed)."""
    x = torch.zeros(N_BLADES, dtype=dtype)
    x[0] = 1.0
    for v in vectors:
        e = torch.zeros(N_BLADES, dtype=dtype)
        e[1 << (v - 1)] = 1.0
        x = gp(x, e)
    return x


def from_grade(coeffs: torch.Tensor, k: int) -> torch.Tensor:
    """Embed (..., C(5, k)) coefficients as a grade-k multivector (blades in BLADES_OF_GRADE[k] order)."""
    out = coeffs.new_zeros(*coeffs.shape[:-1], N_BLADES)
    out[..., list(BLADES_OF_GRADE[k])] = coeffs
    return out


# ----------------------------------------------------------------------------- products


def gp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Geometric product: out_k = sum_i a_i sign(i, i^k) b_(i^k). Batched, broadcasting."""
    # b_pairs[..., i, k] = sign(i, i^k) b_(i^k): one gather from [b, -b] (the sign picks the half)
    b_signed = torch.cat([b, -b], -1).unsqueeze(-2).expand(*b.shape[:-1], N_BLADES, 2 * N_BLADES)
    index = _table("SIGNED_XOR", b).expand(*b.shape[:-1], N_BLADES, N_BLADES)
    b_pairs = torch.gather(b_signed, -1, index)
    return (a.unsqueeze(-2) @ b_pairs).squeeze(-2)  # sum over i of a_i b_pairs[i, k]


def cayley_tensor(dtype=torch.float64) -> torch.Tensor:
    """The dense 32 x 32 x 32 table C[i, j, k] = sign(i, j) if k == i xor j else 0."""
    c = torch.zeros(N_BLADES, N_BLADES, N_BLADES, dtype=dtype)
    c.scatter_(2, XOR.unsqueeze(-1), CAYLEY_SIGN.to(dtype).unsqueeze(-1))
    return c


def gp_dense(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same product as the literal trilinear form a_i b_j C_ijk (reference; 32x the work)."""
    return torch.einsum("...i,...j,ijk->...k", a, b, cayley_tensor(a.dtype).to(a.device))


def reverse(x: torch.Tensor) -> torch.Tensor:
    """x~: reverses the order of vectors in every blade, sign (-1)^(k(k-1)/2) on grade k."""
    return x * _table("REVERSE_SIGN", x)


def involute(x: torch.Tensor) -> torch.Tensor:
    """Grade involution: every vector flips sign, (-1)^k on grade k."""
    return x * _table("INVOLUTE_SIGN", x)


def grade(x: torch.Tensor, k: int) -> torch.Tensor:
    """<x>_k: keep grade k, zero the rest (same shape)."""
    mask = torch.tensor([g == k for g in GRADES], device=x.device)
    return x * mask


def scalar(x: torch.Tensor) -> torch.Tensor:
    """<x>_0 as a (...) tensor."""
    return x[..., 0]


def grade_norms(x: torch.Tensor) -> torch.Tensor:
    """(..., 6): the Euclidean norm of each grade's block of coefficients (positive definite)."""
    return torch.stack(
        [x[..., list(BLADES_OF_GRADE[k])].norm(dim=-1) for k in range(N_VECTORS + 1)], -1
    )


def grade_quadratic(x: torch.Tensor) -> torch.Tensor:
    """(..., 6): <x_k x_k~>_0 per grade k, the algebra's indefinite form (rotor-invariant, any sign)."""
    q = x * x * _table("QUADRATIC_SIGN", x)
    return torch.stack([q[..., list(BLADES_OF_GRADE[k])].sum(-1) for k in range(N_VECTORS + 1)], -1)


def normalize_grades(x: torch.Tensor, grades=(1, 2, 3, 4, 5), eps: float = 1e-12) -> torch.Tensor:
    """Divide each listed grade's block by its Euclidean norm (the seed's per-grade fix; see top)."""
    scale = torch.ones(*x.shape[:-1], N_BLADES, dtype=x.dtype, device=x.device)
    norms = grade_norms(x)
    for k in grades:
        scale[..., list(BLADES_OF_GRADE[k])] = 1.0 / (norms[..., k : k + 1] + eps)
    return x * scale


def sandwich(r: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """R x R~ (two geometric products)."""
    return gp(gp(r, x), reverse(r))


# ----------------------------------------------------------------------------- rotors


def one_like(b: torch.Tensor) -> torch.Tensor:
    one = torch.zeros_like(b)
    one[..., 0] = 1.0
    return one


def exp_taylor(b: torch.Tensor, terms: int = 16) -> torch.Tensor:
    """sum_{n=0}^{terms-1} B^n / n!  (the seed used terms = 16; 12 was not enough for it)."""
    term = one_like(b)
    out = term
    for n in range(1, terms):
        term = gp(term, b) / n
        out = out + term
    return out


def exp_scaling_squaring(b: torch.Tensor, terms: int = 30) -> torch.Tensor:
    """exp(B) = exp(B / 2^s)^(2^s), s chosen so every |B / 2^s| <= 1/4 (one s for the batch)."""
    biggest = float(b.detach().norm(dim=-1).max()) if b.numel() else 0.0
    s = max(0, math.ceil(math.log2(biggest / 0.25))) if biggest > 0 else 0
    r = exp_taylor(b / 2**s, terms)
    for _ in range(s):
        r = gp(r, r)
    return r


def exp_simple(b: torch.Tensor) -> torch.Tensor:
    """Closed form for a simple bivector (B^2 = beta, a scalar): cos/sin, cosh/sinh or 1 + B."""
    beta = scalar(gp(b, b)).unsqueeze(-1)
    a = beta.abs().sqrt()
    safe = torch.where(a > 0, a, torch.ones_like(a))
    c = torch.where(beta < 0, torch.cos(a), torch.cosh(a))
    s = torch.where(beta < 0, torch.sin(a), torch.sinh(a)) / safe
    s = torch.where(a > 0, s, torch.ones_like(s))  # sin(a)/a -> 1 as a -> 0
    return c * one_like(b) + s * b


def split_bivector(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """B = B1 + B2 with B1 B2 = B2 B1 and B1^2 = l1, B2^2 = l2 scalars (the invariant decomposition).

    B^2 = (l1 + l2) + W with W = <B^2>_4 = 2 B1 B2, so W^2 = 4 l1 l2 and l1, l2 are the roots of
    l^2 - <B^2>_0 l + W^2 / 4; then B W / 2 = l1 B2 + l2 B1 gives B1 = <B W / 2 - l1 B>_2 / (l2 - l1).
    Undefined when l1 == l2 (the division); for a simple bivector W = 0 and B1 = B, B2 = 0.
    """
    bb = gp(b, b)
    s = scalar(bb)
    w = grade(bb, 4)
    disc = (s * s - scalar(gp(w, w))).clamp_min(0.0).sqrt()
    l1, l2 = (s + disc) / 2, (s - disc) / 2
    b1 = grade(gp(b, w) / 2 - l1.unsqueeze(-1) * b, 2) / (l2 - l1).unsqueeze(-1)
    # disc = 0: B1 = B if W = 0 (B^2 = 0, simple), else the split is undefined (NaN, not a guess)
    degenerate = torch.where(w.abs().amax(-1, keepdim=True) > 0, torch.full_like(b, math.nan), b)
    b1 = torch.where((disc > 0).unsqueeze(-1), b1, degenerate)
    return b1, b - b1


def exp_closed(b: torch.Tensor) -> torch.Tensor:
    """exp(B) = exp(B1) exp(B2) from the invariant decomposition (B1, B2 commute)."""
    b1, b2 = split_bivector(b)
    return gp(exp_simple(b1), exp_simple(b2))


# ----------------------------------------------------------------------------- random draws


def random_multivector(shape, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """Standard normal coefficients on all 32 blades."""
    return torch.randn(*shape, N_BLADES, generator=generator, dtype=dtype)


def random_bivector(
    shape,
    scale: float,
    generator: torch.Generator,
    dtype=torch.float64,
    euclidean_only: bool = False,
) -> torch.Tensor:
    """N(0, scale^2) coefficients on the 10 bivector blades (only the 6 without e5 if euclidean_only)."""
    coeffs = scale * torch.randn(*shape, len(BLADES_OF_GRADE[2]), generator=generator, dtype=dtype)
    if euclidean_only:
        coeffs = coeffs * torch.tensor([not (i >> 4 & 1) for i in BLADES_OF_GRADE[2]], dtype=dtype)
    return from_grade(coeffs, 2)


# ----------------------------------------------------------------------------- cost


def product_macs(a_grades=range(6), b_grades=range(6), dense_table: bool = False) -> int:
    """Multiply-adds of one geometric product, counted from the Cayley table: every pair of
    nonzero input blades (i, j) contributes one multiply-add to blade i xor j (the signs are free:
    an add or a subtract). dense_table: the literal 32 x 32 x 32 contraction (zeros included)."""
    na = sum(len(BLADES_OF_GRADE[k]) for k in set(a_grades))
    nb = sum(len(BLADES_OF_GRADE[k]) for k in set(b_grades))
    return na * nb * (N_BLADES if dense_table else 1)


def sandwich_flops(
    d: int,
    channels: int = 1,
    rotor_even: bool = False,
    dense_table: bool = False,
    exp_terms: int = 0,
) -> dict:
    """Multiply-adds of one sandwich R x R~ per token pair vs one attention score q.k of width d.

    channels: multivectors per token state (a state of width d = 32 * channels has `channels`);
    rotor_even: count only R's even grades (a rotor has no odd part: 16 of 32 blades);
    dense_table: the dense einsum over the 32^3 table instead of the 1024 nonzero pairs;
    exp_terms: also count the rotor's Taylor series, computed per pair (B^2..B^(terms-1): terms-2
    products of a bivector with an even multivector, plus 32 multiply-adds per term to accumulate).
    """
    r_grades = (0, 2, 4) if rotor_even else range(6)
    one = product_macs(r_grades, range(6), dense_table) + product_macs(
        range(6), r_grades, dense_table
    )
    exp = 0
    if exp_terms > 2:
        exp = (exp_terms - 2) * product_macs((2,), (0, 2, 4), dense_table) + exp_terms * N_BLADES
    sandwich_macs = channels * one + exp
    return {"sandwich_macs": sandwich_macs, "attention_macs": d, "ratio": sandwich_macs / d}
