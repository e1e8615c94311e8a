"""Top-k of log_softmax over the vocabulary, and argmax, as a split-V two-stage reduction.

    logp_topk(logits [..., V], K) -> (logp [..., K] float32, idx [..., K] int64), best first
        logp = log_softmax(logits.float())[idx]         (the draft's branch_topk)
    argmax(logits [..., V]) -> [...] int64              (torch.argmax(-1), bit for bit)

Each row of V logits is cut into P = ceil(V / BLOCK) chunks; BLOCK depends on V alone (and K),
never on the number of rows, so a row's result is the same whatever the batch (batch-invariant
by construction).

    stage 1, grid (N, P): program (r, p) loads x = float(logits[r, p*BLOCK : (p+1)*BLOCK])
        key[v]  = (ord(x[v]) << 32) | (2^31 - 1 - v)      one int64 per token: a larger key is
                                                         a larger value, then a lower index
        top[k]  = k-th largest key (k = 0..K-1: K max-reductions, each over keys < top[k-1])
        m_p     = value of top[0]                        (the chunk max)
        s_p     = sum_v exp(x[v] - m_p)                  (fp32; m_p = -inf counts as 0)
    stage 2, grid (N,): program r merges the P partials
        M       = max_p m_p
        lse_off = log(sum_p s_p * exp(m_p - M))          so log_softmax(x) = (x - M) - lse_off
        the K largest of the P*K chunk keys (K max-reductions as above)
        logp[k] = (value(key_k) - M) - lse_off,  idx[k] = index(key_k)

The order key `ord` maps a float's bits to a signed int32 that sorts like the float
(negatives get their magnitude bits flipped); -0.0 is read as +0.0 and every NaN as one value
above +inf. So the selection order is: larger logit first, equal logits by the lower token
index (torch.argmax's rule, NaN first as torch does; torch.topk leaves tie order unspecified).
The K-th candidate of a chunk with fewer than K tokens is a sentinel key below every real one.

Numerics (fp32 accumulation; bf16/fp16 logits are widened exactly): logp is torch's formula
(x - max) - log(sum exp(x - max)) with the sum taken in another order (and, on the GPU, with
Triton's fast exp/log), so it agrees with torch's log_softmax to ~1e-6 absolute for logits of
magnitude <= 100 (tests use rtol = atol = 1e-5). The selection is exact on the fp32 logits:
where log_softmax rounds two distinct logits to one logp, the larger logit ranks first. A row
of all -inf gives NaN logp (as torch); -inf logits give -inf logp; a NaN logit makes the row's
logp NaN (as torch). Indices equal torch's wherever the values are distinct.

`logp_topk` and `argmax` run the kernels on CUDA tensors and the plain-torch references
(`logp_topk_ref`, `argmax_ref`) elsewhere or inside `references()` (fused_ops.dispatch); K >
MAX_K or K > V run the reference. Static grids, no host synchronisation: CUDA-graph capturable.
"""
from __future__ import annotations

import torch

from ..lazy_triton import tl, triton
from .fused_ops import dispatch
from .stamp import CARRY_CODES, Carried, carried_begin, carry_args

MAX_K = 16                   # larger K runs the torch reference
_SENT = tl.constexpr(-2 ** 63)   # below every real key (a real key's high word >= ord(-inf))


@triton.jit
def _key(x, idx):
    """(fp32 value, int32 index) -> int64 key: larger value first, then lower index."""
    x = tl.where(x == 0.0, 0.0, x)                       # -0.0 ties +0.0
    bits = x.to(tl.int32, bitcast=True)
    hi = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    hi = tl.where(x != x, 0x7FFFFFFF, hi)                # NaN above +inf
    return (hi.to(tl.int64) << 32) | (2147483647 - idx).to(tl.int64)


@triton.jit
def _value(key):
    hi = (key >> 32).to(tl.int32)
    bits = tl.where(hi < 0, hi ^ 0x7FFFFFFF, hi)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _index(key):
    return 2147483647 - (key & 0x7FFFFFFF).to(tl.int32)


@triton.jit(do_not_specialize=CARRY_CODES)
def _partial_kernel(X, PKey, PMax, PSum, V, stride_x, P,
                    K: tl.constexpr, BLOCK: tl.constexpr, LSE: tl.constexpr,
                    Ring, Count, Clock, Done, code_b, code_e, st_mask,
                    STAMP_B: tl.constexpr, STAMP_E: tl.constexpr, GLOBALTIMER: tl.constexpr):
    """Stage 1: chunk p of row r -> its K best keys (+ chunk max and sum of exp if LSE); may
    carry a captured stage's begin stamp (kernels/stamp.py: accept's, in its graph). It never
    ends a stage (the merge runs after it): the end arguments of `carry_args` stay unused."""
    carried_begin(Ring, Count, Clock, code_b, st_mask, STAMP_B, GLOBALTIMER)
    row = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    cols = p * BLOCK + tl.arange(0, BLOCK)
    ok = cols < V
    x = tl.load(X + row * stride_x + cols, mask=ok, other=float("-inf")).to(tl.float32)
    keys = tl.where(ok, _key(x, cols), _SENT)
    out = (row * P + p) * K
    best = tl.max(keys, axis=0)
    tl.store(PKey + out, best)
    if LSE:
        m = _value(best)
        ms = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(tl.exp(x - ms), axis=0)              # masked lanes: exp(-inf) = 0
        tl.store(PMax + row * P + p, m)
        tl.store(PSum + row * P + p, s)
    for k in tl.static_range(1, K):
        best = tl.max(tl.where(keys < best, keys, _SENT), axis=0)
        tl.store(PKey + out + k, best)


@triton.jit
def _merge_kernel(PKey, PMax, PSum, OutV, OutI, P, K: tl.constexpr, BLOCK_P: tl.constexpr,
                  BLOCK_C: tl.constexpr, LSE: tl.constexpr):
    """Stage 2: row r's P partials -> global logsumexp and the K best keys."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    keys = tl.load(PKey + row * P * K + c, mask=c < P * K, other=_SENT)
    if LSE:
        p = tl.arange(0, BLOCK_P)
        pok = p < P
        m = tl.load(PMax + row * P + p, mask=pok, other=float("-inf"))
        s = tl.load(PSum + row * P + p, mask=pok, other=0.0)
        M = tl.max(m, axis=0)
        ms = tl.where(M == float("-inf"), 0.0, M)
        off = tl.log(tl.sum(s * tl.exp(m - ms), axis=0))
    best = tl.max(keys, axis=0)
    for k in tl.static_range(K):
        if k > 0:
            best = tl.max(tl.where(keys < best, keys, _SENT), axis=0)
        if LSE:
            tl.store(OutV + row * K + k, (_value(best) - M) - off)
        tl.store(OutI + row * K + k, _index(best).to(tl.int64))


def chunk_size(V: int, K: int = 1) -> int:
    """BLOCK for a vocabulary of V: ~128 chunks per row (enough programs to fill the GPU at
    one row), 256..4096 tokens each, and at most 4096 stage-2 candidates (P*K)."""
    block = min(4096, max(256, triton.next_power_of_2(triton.cdiv(V, 128))))
    while triton.cdiv(V, block) * K > 4096:
        block *= 2
    return block


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def _run(logits: torch.Tensor, K: int, lse: bool, block: int | None,
         begin: Carried | None = None, clock: torch.Tensor | None = None):
    V = logits.shape[-1]
    x = logits.reshape(-1, V)
    if x.stride(-1) != 1:
        x = x.contiguous()
    N = x.shape[0]
    block = block or chunk_size(V, K)
    P = triton.cdiv(V, block)
    dev = logits.device
    pkey = torch.empty(N, P, K, dtype=torch.int64, device=dev)
    pmax = torch.empty(N, P, dtype=torch.float32, device=dev) if lse else pkey
    psum = torch.empty(N, P, dtype=torch.float32, device=dev) if lse else pkey
    out_v = torch.empty(N, K, dtype=torch.float32, device=dev) if lse else pkey
    out_i = torch.empty(N, K, dtype=torch.int64, device=dev)
    if N:
        _partial_kernel[(N, P)](x, pkey, pmax, psum, V, x.stride(0), P, K=K, BLOCK=block,
                                LSE=lse, num_warps=_warps(block),
                                **carry_args(begin, None, x, clock))
        bc = max(16, triton.next_power_of_2(P * K))
        _merge_kernel[(N,)](pkey, pmax, psum, out_v, out_i, P, K=K,
                            BLOCK_P=max(16, triton.next_power_of_2(P)), BLOCK_C=bc, LSE=lse,
                            num_warps=_warps(bc))
    return out_v, out_i


# -- top-k of log_softmax ------------------------------------------------------------------
def logp_topk_ref(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., V] -> (log-probs [..., K] float32, tokens [..., K] int64), best first."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    vals, idx = torch.topk(logp, k, dim=-1, sorted=True)
    return vals, idx


def logp_topk_triton(logits: torch.Tensor, k: int, block: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of `logp_topk_ref` (ties: the lower token index first); `block`
    overrides the chunk size (tests)."""
    if not 1 <= k <= min(MAX_K, logits.shape[-1]):
        raise ValueError(f"logp_topk_triton: k={k} must be in [1, min({MAX_K}, V)].")
    v, i = _run(logits, k, True, block)
    lead = logits.shape[:-1]
    return v.view(*lead, k), i.view(*lead, k)


def logp_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_softmax top-k values, token ids): the kernel on CUDA, the reference elsewhere."""
    if not 1 <= k <= min(MAX_K, logits.shape[-1]):
        return logp_topk_ref(logits, k)
    return dispatch("logp_topk", logp_topk_triton, logp_topk_ref, logits, k)


# -- argmax --------------------------------------------------------------------------------
def argmax_ref(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)


def argmax_triton(logits: torch.Tensor, block: int | None = None, begin: Carried | None = None,
                  clock: torch.Tensor | None = None) -> torch.Tensor:
    """Triton version of `argmax_ref`: the first maximal index (a NaN counts as the maximum,
    the first NaN wins), as torch.argmax. `begin`: a stage's begin stamp, carried by the
    first stage's program (0, 0)."""
    if logits.shape[-1] == 0:
        raise ValueError("argmax_triton: empty last dimension.")
    if begin is not None and logits.numel() == 0:
        raise ValueError("argmax_triton: an empty batch launches no kernel to carry a stamp.")
    _, i = _run(logits, 1, False, block, begin, clock)
    return i.view(logits.shape[:-1])


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> [...] int64 argmax over the last dim (kernel on CUDA)."""
    return dispatch("argmax", argmax_triton, argmax_ref, logits)
