"""Batched token sampling without host syncs (graph capturable).

Randomness is counter based: the uniform for (request seed, token index, vocab id) is a
hash, so a request's samples do not depend on batch composition, retraction or the device.
Greedy lanes (temperature == 0) take the argmax.
"""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2^32) (no overflow)."""
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def counter_uniform(seeds: torch.Tensor, counters: torch.Tensor, n: int) -> torch.Tensor:
    """[B, n] float64 uniforms in (0, 1), a pure function of (seed, counter, column)."""
    key = _mix32((seeds.long() & _M32) ^ _mix32((counters.long() + 0x9E3779B9) & _M32))
    col = _mix32(torch.arange(n, device=seeds.device, dtype=torch.long) + 0x85EBCA6B)
    u = _mix32(key[:, None] ^ col[None, :])
    return (u.double() + 0.5) / 4294967296.0


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


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
           seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """logits [B, V] -> tokens [B] (int64). Gumbel-max over the top-p set."""
    greedy = logits.argmax(-1)
    probs = target_probs(logits, temperature, top_p)
    u = counter_uniform(seeds, counters, logits.shape[-1])
    gumbel = -torch.log(-torch.log(u))
    score = torch.where(probs > 0, probs.double().log() + gumbel, torch.full_like(gumbel, -torch.inf))
    return torch.where(temperature > 0, score.argmax(-1), greedy)
