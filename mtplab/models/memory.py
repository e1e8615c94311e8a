"""Memory estimate of an engine before anything is allocated, and one clear refusal.

    weights   target (+ the chosen draft, + a hot draft vocabulary's row copy) parameters x
              bytes of the run dtype
    kv        target pool: per layer slots x Hkv_l x d_l x 2 (K and V) x dtype bytes, slots =
              (max_total_tokens // P + 1) * P as the engine allocates (+ one layer for a draft
              that owns KV). Sliding-window layers store their KV in full, like the others
              (one pool, one req_to_token row per request): they *read* only their window (the
              attention kernels) but hold every entry. The estimate names their share and what
              a window-only pool (SGLang's SWA pool) would hold instead: per running request
              its window + a page, per sliding layer.
    workspace max(256 MiB, 10% of weights + kv): activations, logits, graphs, allocator slack
    host      the builder makes every model in float32 on the host first, then moves it
On CUDA the device must hold weights + kv + workspace and the host the float32 build; on the
CPU the host holds both (the float32 build is the model itself when dtype is float32).
"""
from __future__ import annotations

import gc
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..draft_kinds import DRAFT_KINDS, parse_draft_vocab
from ..errors import ConfigError
from .llama_config import LlamaConfig, routing_skew

GiB = 1 << 30
WORKSPACE_MIN = 256 << 20


class InsufficientMemoryError(ConfigError):
    """The estimate does not fit the free memory; the message names the sizes and the fix."""


def target_params(c: LlamaConfig) -> int:
    """Every tensor of the checkpoint the config implies (a tied LM head once): dense or MoE
    FFNs alike."""
    shapes = c.hf_tensor_shapes()
    if c.tie_word_embeddings:
        del shapes["lm_head.weight"]
    return sum(math.prod(s) for s in shapes.values())


def draft_params(c: LlamaConfig, draft: str) -> int:
    """Parameters a draft owns (the embedding and LM head it reads are the target's): its
    kind's count (draft_kinds.py), 0 for "none"."""
    return DRAFT_KINDS[draft].param_count(c) if draft in DRAFT_KINDS else 0


@dataclass(frozen=True)
class MemoryEstimate:
    model: str
    device: str
    weights_bytes: int
    kv_bytes: int
    kv_slots: int
    workspace_bytes: int
    host_build_bytes: int
    kv_sliding_bytes: int = 0      # of kv_bytes: the sliding layers' (stored in full)
    kv_window_only_bytes: int = 0  # what those layers would hold for their windows only

    @property
    def device_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.workspace_bytes

    def describe(self) -> str:
        return (f"memory estimate for {self.model} on {self.device}: "
                f"{self.device_bytes / GiB:.2f} GiB = weights {self.weights_bytes / GiB:.2f} "
                f"+ KV {self.kv_bytes / GiB:.2f} ({self.kv_slots} slots{self._sliding()}) "
                f"+ workspace {self.workspace_bytes / GiB:.2f}; host build (float32) "
                f"{self.host_build_bytes / GiB:.2f} GiB")

    def _sliding(self) -> str:
        if not self.kv_sliding_bytes:
            return ""
        return (f"; sliding layers {self.kv_sliding_bytes / GiB:.2f} of it, stored in full "
                f"-- {self.kv_window_only_bytes / GiB:.2f} for their windows only")


def estimate_memory(cfg) -> MemoryEstimate:
    """`cfg` is a resolved RunConfig (model, draft, dtype, device, page_size, max_total_tokens)."""
    from .zoo import model_config
    mc = model_config(cfg.model)
    mc.moe_router_bias = bool(routing_skew(cfg.moe_routing))    # the skew's router bias
    nbytes = torch.empty(0, dtype=getattr(torch, cfg.dtype)).element_size()
    params = target_params(mc) + draft_params(mc, cfg.draft)
    dv = parse_draft_vocab(cfg.draft_vocab)
    if dv.kind == "hot":            # the hot rows' copy, at most the target's width
        params += dv.size * mc.hidden_size
    P = cfg.page_size
    slots = (cfg.max_total_tokens // P + 1) * P
    own_kv = cfg.draft in DRAFT_KINDS and DRAFT_KINDS[cfg.draft].owns_kv
    L = mc.num_hidden_layers
    layers = list(range(L)) + ([L - 1] if own_kv else [])    # a draft's pool: the last layer's
    # one slot of one layer, K and V: a Gemma-4 global layer's own heads and head_dim
    entry = {li: mc.attn_shape(li)[0] * mc.attn_shape(li)[1] * 2 * nbytes for li in layers}
    kv = slots * sum(entry[li] for li in layers)
    sliding = [li for li in layers if mc.window_of(li)]
    window_only = sum(min(slots, cfg.max_running_requests * (mc.window_of(li) + P)) * entry[li]
                      for li in sliding)
    weights = params * nbytes
    return MemoryEstimate(cfg.model, cfg.device, weights, kv,
                          slots, max(WORKSPACE_MIN, (weights + kv) // 10), params * 4,
                          slots * sum(entry[li] for li in sliding), window_only)


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else the physical total."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_free_bytes(device: str) -> int:
    """Bytes an engine can still allocate on `device`. On CUDA, blocks torch's caching
    allocator holds with no tensor in them (an engine closed earlier in this process) are
    given back to the device first, so they count as free."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if torch.cuda.memory_reserved(dev) > torch.cuda.memory_allocated(dev):
            gc.collect()                   # tensors only a reference cycle still holds
            torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(dev)[0]
    return host_available_bytes()


def check_memory(cfg, free_bytes: Optional[int] = None, host_free_bytes: Optional[int] = None,
                 log: Callable[[str], None] = print) -> MemoryEstimate:
    """Print the estimate; raise InsufficientMemoryError when it cannot fit. Free sizes default
    to what the device and host report now."""
    est = estimate_memory(cfg)
    log(est.describe())
    on_cuda = torch.device(cfg.device).type == "cuda"
    free = device_free_bytes(cfg.device) if free_bytes is None else free_bytes
    need = est.device_bytes
    if not on_cuda and cfg.dtype != "float32":
        need += est.host_build_bytes
    fix = ("lower max_total_tokens / max_running_requests / context_len, or choose fewer layers "
           "(--layers N)")
    if need > free:
        raise InsufficientMemoryError(
            f"{cfg.model} (draft {cfg.draft}) needs about {need / GiB:.2f} GiB on {cfg.device} "
            f"(weights {est.weights_bytes / GiB:.2f} + KV {est.kv_bytes / GiB:.2f} + workspace "
            f"{est.workspace_bytes / GiB:.2f}) but only {free / GiB:.2f} GiB is free; {fix}.")
    if on_cuda:
        host = host_available_bytes() if host_free_bytes is None else host_free_bytes
        if est.host_build_bytes > host:
            raise InsufficientMemoryError(
                f"{cfg.model} is built in float32 on the host first and needs about "
                f"{est.host_build_bytes / GiB:.2f} GiB of host memory, but only "
                f"{host / GiB:.2f} GiB is available; {fix}.")
    return est
