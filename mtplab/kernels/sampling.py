"""Batched token sampling without host syncs (graph capturable).

Randomness is counter based and keyed by position: the token at absolute position t of a
request with seed s is decided by one uniform u(s, t) (`position_uniform`), by inverse CDF
over the target distribution. Every sampler draws it the same way -- the (re-)prefill, a
target-only decode step, and level k of a speculative tree walk (which decides position
seq_len + 1 + k) -- so a request's samples depend on neither batch composition, nor step
boundaries (accept lengths), nor retraction, nor the device kind. Greedy lanes
(temperature == 0) take the argmax.

    stream 0  SAMPLE    the draw that picks the token at t
    stream 1  SIMULATE  the coin of simulated acceptance at t (independent of stream 0)

On CUDA two of the step's helpers are one Triton kernel each, beside their torch references
(`*_ref`, the CPU path and the tests' oracles): `position_uniform` (the hash's 32-bit integer
ops, bit for bit) and `finite_rows` (one pass over the logits and the hidden states, where
torch runs about ten small kernels).
"""
from __future__ import annotations

import torch

from ..core import NONFINITE_TOKEN
from ..lazy_triton import tl, triton
from .fused_ops import dispatch
from .topk import argmax

_M32 = 0xFFFFFFFF
SAMPLE, SIMULATE = 0, 1     # streams: columns of counter_uniform


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2^32) (no overflow)."""
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def counter_uniform(seeds: torch.Tensor, counters: torch.Tensor, n: int) -> torch.Tensor:
    """[B, n] float64 uniforms in (0, 1), a pure function of (seed, counter, column).
    Seeds are used modulo 2^32 (RunConfig and generate keep them in [0, 2^32))."""
    key = _mix32((seeds.long() & _M32) ^ _mix32((counters.long() + 0x9E3779B9) & _M32))
    col = _mix32(torch.arange(n, device=seeds.device, dtype=torch.long) + 0x85EBCA6B)
    u = _mix32(key[:, None] ^ col[None, :])
    return (u.double() + 0.5) / 4294967296.0


def position_uniform(seeds: torch.Tensor, first_position: torch.Tensor, n: int,
                     stream: int = SAMPLE) -> torch.Tensor:
    """[B, n] float64: u[b, k] = the `stream` uniform of seed b at absolute token position
    first_position[b] + k. A pure function of (seed, position, stream), never of the step.
    One kernel on CUDA (`_position_uniform_kernel`), `position_uniform_ref` elsewhere."""
    return dispatch("position_uniform", _position_uniform_triton, position_uniform_ref, seeds,
                    first_position, n, stream)


def position_uniform_ref(seeds: torch.Tensor, first_position: torch.Tensor, n: int,
                         stream: int = SAMPLE) -> torch.Tensor:
    """`position_uniform` in torch: column `stream` of counter_uniform over the positions."""
    B = seeds.shape[0]
    pos = first_position.long()[:, None] + torch.arange(n, device=seeds.device)
    u = counter_uniform(seeds.long()[:, None].expand(B, n).reshape(-1), pos.reshape(-1),
                        stream + 1)
    return u[:, stream].view(B, n)


@triton.jit
def _mix32_tl(x):
    """`_mix32` on uint32 values: each product in int64 (below 2^59), kept mod 2^32."""
    m32 = tl.full([], 0xFFFFFFFF, tl.int64)
    x = (((x ^ (x >> 16)).to(tl.int64) * 0x45D9F3B) & m32).to(tl.uint32)
    x = (((x ^ (x >> 16)).to(tl.int64) * 0x45D9F3B) & m32).to(tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _position_uniform_kernel(Seeds, First, Out, total, n, STREAM: tl.constexpr,
                             BLOCK: tl.constexpr):
    """Element i = (b, k) of the [B, n] output: counter_uniform's column STREAM for
    (seed b, counter first[b] + k), the same 32-bit ops (seed and counter taken mod 2^32)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < total
    b = i // n
    seed = tl.load(Seeds + b, mask=ok, other=0).to(tl.int64).to(tl.uint32)
    pos = (tl.load(First + b, mask=ok, other=0).to(tl.int64) + i % n).to(tl.uint32)
    key = _mix32_tl(seed ^ _mix32_tl(pos + 0x9E3779B9))
    col = _mix32_tl(tl.zeros([BLOCK], tl.uint32) + (STREAM + 0x85EBCA6B))
    u = _mix32_tl(key ^ col)
    tl.store(Out + i, (u.to(tl.float64) + 0.5) / 4294967296.0, mask=ok)


def _position_uniform_triton(seeds, first_position, n, stream=SAMPLE):
    B = seeds.shape[0]
    out = torch.empty(B, n, dtype=torch.float64, device=seeds.device)
    block = 128
    if B * n:
        _position_uniform_kernel[(triton.cdiv(B * n, block),)](
            seeds, first_position, out, B * n, n, STREAM=stream, BLOCK=block)
    return out


def top_p_keep(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[..., V] bool: the smallest prefix of tokens (by prob) whose mass reaches top_p (the
    most likely token always; every token when top_p >= 1). top_p has probs' leading shape."""
    sp, si = probs.sort(-1, descending=True)
    tp = top_p.float()[..., None]
    keep_sorted = ((sp.cumsum(-1) - sp) < tp) | (tp >= 1.0)
    keep_sorted[..., 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, si, keep_sorted)


def target_probs(logits: torch.Tensor, temperature: torch.Tensor,
                 top_p: torch.Tensor) -> torch.Tensor:
    """The distribution sampled from, [..., V] float32: softmax(logits / T) restricted to
    top-p and renormalised; temperature <= 0 is greedy (one-hot argmax). temperature and
    top_p have the logits' leading shape."""
    logits = logits.float()
    t = temperature.float()[..., None]
    probs = torch.softmax(logits / torch.where(t > 0, t, torch.ones_like(t)), dim=-1)
    greedy = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    probs = torch.where(t > 0, probs, greedy)
    probs = probs * top_p_keep(probs, top_p)
    return probs / probs.sum(-1, keepdim=True)


def last_in_support(probs: torch.Tensor) -> torch.Tensor:
    """[...]: the largest token id with probability > 0 (inverse_cdf never steps past it)."""
    vocab = torch.arange(probs.shape[-1], device=probs.device)
    return torch.where(probs > 0, vocab, -1).amax(dim=-1)


def inverse_cdf(cdf: torch.Tensor, last: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """cdf [B, V] (cumsum of probs), last [B] (last_in_support), u [B] in (0, 1) -> [B] int64:
    the first token whose cumulative mass exceeds u * total. The one draw every sampler
    uses, so equal (probs, u) give the same token in prefill, decode and tree accept."""
    thr = u.float()[:, None] * cdf[:, -1:]
    x = torch.searchsorted(cdf.contiguous(), thr.contiguous(), right=True)[:, 0]
    # u*total may round up to total: never step past the last token with mass. A row with no
    # mass (NaN logits: last = -1) gets token 0, a valid next input; the step reports it as
    # NONFINITE_TOKEN (flag_nonfinite).
    return torch.minimum(x, last.clamp(min=0))


def finite_rows(logits: torch.Tensor, hidden: torch.Tensor, rows: int) -> torch.Tensor:
    """[rows] bool: row r's logits hold no NaN and no inf, and the sum of squares of its
    hidden states before the final norm is finite (`logits` / `hidden` reshaped to [rows, -1]:
    one token, or the D tree nodes of one request, per row). The second part catches an
    overflowing residual stream (|h| above ~1e17: weights of 1e30), whose fp32 sum of squares
    the final RMSNorm would turn into all-zero, finite logits. No host sync; on CUDA one
    kernel over row chunks and one `all` (`_finite_kernel`), `finite_rows_ref` elsewhere."""
    return dispatch("finite_rows", _finite_rows_triton, finite_rows_ref, logits, hidden, rows)


def finite_rows_ref(logits: torch.Tensor, hidden: torch.Tensor, rows: int) -> torch.Tensor:
    """`finite_rows` in torch."""
    energy = hidden.float().square().reshape(rows, -1).sum(-1)
    return torch.isfinite(logits.reshape(rows, -1)).all(-1) & torch.isfinite(energy)


FINITE_BLOCK = 2048          # logits a program reads per trip
FINITE_PROGRAMS = 256        # programs a launch aims at (a row's chunks: at least one each)


@triton.jit
def _finite_kernel(L, Hd, Ok, nl, nh, chunk, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """Program (r, s): Ok[r, s] = its chunk [s*chunk, (s+1)*chunk) of row r's logits is all
    finite and, for s = 0, so is the fp32 sum of squares of row r's hidden states."""
    r = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    bad = tl.zeros([BLOCK], tl.int32)
    lo = s * chunk
    for k in range(lo, tl.minimum(lo + chunk, nl), BLOCK):
        m = k + offs < tl.minimum(lo + chunk, nl)
        x = tl.load(L + r * nl + k + offs, mask=m, other=0.0).to(tl.float32)
        bad |= ((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32)
    ok = tl.max(bad, axis=0) == 0
    if s == 0:
        acc = tl.zeros([BLOCK], tl.float32)
        for k in range(0, nh, BLOCK):
            h = tl.load(Hd + r * nh + k + offs, mask=k + offs < nh, other=0.0).to(tl.float32)
            acc += h * h
        e = tl.sum(acc, axis=0)
        ok = ok & (e == e) & (tl.abs(e) != float("inf"))
    tl.store(Ok + r * SPLIT + s, ok)


def _finite_rows_triton(logits, hidden, rows):
    lg, hd = logits.reshape(rows, -1), hidden.reshape(rows, -1)
    if not (lg.is_contiguous() and hd.is_contiguous()) or rows == 0:
        return finite_rows_ref(logits, hidden, rows)
    nl, nh = lg.shape[1], hd.shape[1]
    trips = max(1, triton.cdiv(nl, FINITE_BLOCK))
    split = max(1, min(trips, triton.cdiv(FINITE_PROGRAMS, rows)))
    chunk = triton.cdiv(trips, split) * FINITE_BLOCK
    split = max(1, triton.cdiv(nl, chunk))
    ok = torch.empty(rows, split, dtype=torch.bool, device=lg.device)
    _finite_kernel[(rows, split)](lg, hd, ok, nl, nh, chunk, SPLIT=split, BLOCK=FINITE_BLOCK)
    return ok.all(-1) if split > 1 else ok[:, 0]


def nonfinite_token(device) -> torch.Tensor:
    """NONFINITE_TOKEN as a 0-dim int64 tensor on `device`: flag_nonfinite's `bad`, made once
    by a worker, outside any graph capture."""
    return torch.tensor(NONFINITE_TOKEN, dtype=torch.long, device=device)


def flag_nonfinite(tokens: torch.Tensor, ok: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """A copy of `tokens` ([B] or [B, n]) for the host: rows where `ok` [B] is False read
    `bad` (nonfinite_token: NONFINITE_TOKEN; the scheduler raises on it when it processes the
    step's results). One kernel: a Python scalar in `bad`'s place costs a fill kernel per call
    on CUDA, where torch puts it on the device first."""
    return torch.where(ok.view((-1,) + (1,) * (tokens.dim() - 1)), tokens, bad)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
           seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> tokens [B] (int64). counters [B]: the absolute position of the token
    being sampled (= tokens before it). Inverse CDF over the top-p set."""
    greedy = argmax(logits)
    probs = target_probs(logits, temperature, top_p)
    u = position_uniform(seeds, counters, 1)[:, 0]
    tok = inverse_cdf(torch.cumsum(probs, dim=-1), last_in_support(probs), u)
    return torch.where(temperature > 0, tok, greedy)
