"""Engine: the public entry point. Builds the model, KV memory, worker and scheduler from a
RunConfig and serves `generate` calls.

    eng = Engine(RunConfig(model="random-tiny", page_size=16))
    out = eng.generate(["def f(x):"], max_new_tokens=32)   # list[list[int]]
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Optional, Sequence, Union

from tqdm.auto import tqdm

from .config import ConfigError, RunConfig
from .device import resolve_device
from .kernels.attention_ref import paged_attention_ref
from .mem.allocator import PagedAllocator
from .mem.invariants import check_kv_invariants
from .mem.kv_cache import KVCache
from .mem.kv_manager import KVManager
from .mem.req_pool import ReqToTokenPool
from .models.memory import check_memory
from .models.weights import save_model
from .atomic import atomic_path, atomic_write_text
from .instrument.session import ProfilerSession
from .instrument.spans import Spans
from .instrument.timeline import EventTimeline
from .models.zoo import build_drafts, build_target
from .core import Req, SamplingParams
from .sched.future_map import FutureMap
from .sched.scheduler import LoopOptions, Scheduler
from .speculative.draft_select import num_candidates
from .speculative.draft_eagle import EagleDraftWorker
from .speculative.draft_frozen import FrozenDraftWorker
from .speculative.worker import SpecParams, SpecWorker
from .speculative.target_worker import TargetWorker
from .validate import check_generate_args

Prompt = Union[str, Sequence[int]]
logger = logging.getLogger("mtplab")


def attention_fn(backend: str):
    if backend == "triton":
        from .kernels.triton_attention import paged_attention_triton
        return paged_attention_triton
    return paged_attention_ref


class Engine:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        check_memory(cfg, log=logger.info)        # fails with one sentence before allocating
        dev = self.device.torch_device
        model, self.tokenizer = build_target(cfg.model, cfg.seed)
        self.model = model.to(dev, cfg.torch_dtype)
        mc = self.model.config
        P = cfg.page_size
        num_slots = (cfg.max_total_tokens // P + 1) * P          # + the padding page
        self.allocator = PagedAllocator(num_slots, P)
        self.pool = ReqToTokenPool(cfg.max_running_requests, cfg.row_width, dev,
                                    self.device.h2d)
        self.kv_cache = KVCache.allocate(mc.num_hidden_layers, num_slots, mc.num_key_value_heads,
                                         mc.head_dim, cfg.torch_dtype, dev)
        self.kv = KVManager(self.allocator, self.pool)
        attn = attention_fn(cfg.attention_backend)
        self._start_profiling()              # before graph capture (CUPTI must see it)
        self.future_map = FutureMap(
            cfg.max_running_requests, mc.hidden_size if cfg.speculative else 0, cfg.topk,
            cfg.torch_dtype, self.device, with_topk=cfg.draft == "eagle",
            num_candidates=num_candidates(cfg.num_steps, cfg.topk) if cfg.zb_draft_preexec else 0,
            poison=cfg.debug_future_map)
        self.target_worker = TargetWorker(self.model, self.kv_cache, self.pool.table, attn,
                                          cfg.cuda_graphs and not cfg.speculative,
                                          min(cfg.cuda_graph_max_bs, cfg.max_running_requests),
                                          self.future_map, self.spans)
        self.worker = self.target_worker
        self.draft_model = None
        if cfg.speculative:
            self.worker = self._spec_worker(num_slots, attn)
        self.scheduler = self._new_scheduler()
        self._next_rid = 0
        self._last_stats: dict = {}

    def _spec_worker(self, num_slots: int, attn) -> SpecWorker:
        cfg, dev, mc = self.cfg, self.device.torch_device, self.model.config
        assistant, eagle = build_drafts(self.model, cfg.seed)
        if cfg.draft == "frozen_kv_mtp":
            self.draft_model = assistant.to(dev, cfg.torch_dtype)
            draft = FrozenDraftWorker(self.draft_model, self.kv_cache, self.pool.table, attn,
                                      cfg.num_steps, cfg.topk, self.spans)
        else:
            self.draft_model = eagle.to(dev, cfg.torch_dtype)
            self.draft_kv = KVCache.allocate(1, num_slots, mc.num_key_value_heads, mc.head_dim,
                                             cfg.torch_dtype, dev)
            draft = EagleDraftWorker(self.draft_model, self.draft_kv, self.pool.table, attn,
                                     cfg.num_steps, cfg.topk, cfg.page_size, self.spans)
        params = SpecParams(cfg.draft, cfg.num_steps, cfg.topk, cfg.num_draft_tokens,
                            cfg.fold_seed, cfg.zb_draft_preexec, cfg.simulate_accept_len,
                            cfg.simulate_accept_rates)
        return SpecWorker(self.target_worker, draft, self.future_map, params, cfg.cuda_graphs,
                          min(cfg.cuda_graph_max_bs, cfg.max_running_requests))

    # -- profiling -----------------------------------------------------------------------
    def _start_profiling(self) -> None:
        cfg = self.cfg
        self.run_dir = Path(cfg.trace_dir) / (cfg.run_name or time.strftime(
            f"%Y%m%d-%H%M%S-{Path(cfg.model).name}-{cfg.draft}"))
        self.timeline = EventTimeline(self.device.is_cuda) if cfg.event_timeline else None
        self.spans = Spans(enabled=cfg.profile or cfg.event_timeline, timeline=self.timeline,
                           annotate=cfg.profile, sample_every=cfg.event_timeline_every)
        self.profiler = None
        if cfg.profile:
            self.profiler = ProfilerSession(self.run_dir, wait=cfg.profile_wait,
                                            warmup=cfg.profile_warmup, active=cfg.profile_active,
                                            cuda=self.device.is_cuda)
            self.profiler.start()

    def finish(self) -> dict:
        """Stop profiling and write the run folder: manifest.json, the Kineto trace(s) and
        timeline.parquet (atomically). Returns {name: path} of what was written."""
        written = {}
        if self.profiler is not None:
            self.profiler.stop()
            written.update({f"trace{i}": p for i, p in enumerate(self.profiler.traces)})
        if self.timeline is not None:
            with atomic_path(self.run_dir / "timeline.parquet") as tmp:
                self.timeline.to_frame().to_parquet(tmp)
            written["timeline"] = self.run_dir / "timeline.parquet"
        if written:
            written["manifest"] = atomic_write_text(self.run_dir / "manifest.json",
                                                    json.dumps(self.cfg.manifest(), indent=2))
        return written

    def timeline_frame(self):
        """The event timeline so far (pandas DataFrame; see instrument/timeline.py)."""
        if self.timeline is None:
            raise RuntimeError("the event timeline is off; construct with event_timeline=True.")
        return self.timeline.to_frame()

    def _new_scheduler(self) -> Scheduler:
        hook = self.check_invariants if self.cfg.debug_invariants else None
        return Scheduler(self.worker, self.kv, self.device,
                         max_running=self.cfg.max_running_requests,
                         spans=self.spans,
                         on_step=self.profiler.step if self.profiler else None,
                         reserve_per_decode=self.cfg.reserve_per_decode,
                         alloc_len_per_decode=self.cfg.alloc_len_per_decode,
                         tokens_per_decode=self.cfg.tokens_per_decode, on_iteration=hook,
                         loop=LoopOptions(overlap=self.cfg.overlap,
                                          async_d2h=self.cfg.zb_async_d2h,
                                          device_seq_lens=self.cfg.zb_device_seq_lens,
                                          draft_preexec=self.cfg.zb_draft_preexec,
                                          debug_syncs=self.cfg.debug_syncs))

    # -- requests ------------------------------------------------------------------------
    def _make_request(self, prompt: Prompt, max_new_tokens: int, sampling: SamplingParams,
                      stop_ids: frozenset) -> Req:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ValueError("a prompt must hold at least one token.")
        V = self.model.config.vocab_size
        if min(ids) < 0 or max(ids) >= V:
            raise ValueError(f"prompt token ids must lie in [0, {V}); got {min(ids)}..{max(ids)}.")
        if len(ids) + max_new_tokens > self.cfg.context_len:
            raise ValueError(f"prompt of {len(ids)} tokens + max_new_tokens={max_new_tokens} "
                             f"exceeds context_len={self.cfg.context_len}; shorten the prompt, "
                             "lower max_new_tokens or raise context_len.")
        rid = self._next_rid
        self._next_rid += 1
        return Req(rid, ids, max_new_tokens, sampling, stop_ids)

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 32, *,
                 temperature: float = 0.0, top_p: float = 1.0, seed: Optional[int] = None,
                 stop_ids: Optional[Sequence[int]] = None, ignore_eos: bool = False,
                 progress: bool = False) -> list[list[int]]:
        """Generate for every prompt (token-id lists or strings); returns output ids in order.
        Greedy when temperature == 0. Each request i samples with seed `seed + i` (default:
        the config seed). Stops at EOS (unless ignore_eos), at `stop_ids`, or at the limit."""
        prompts, stop_ids = check_generate_args(prompts, max_new_tokens, temperature, top_p,
                                                seed, stop_ids, ignore_eos, progress,
                                                vocab_size=self.model.config.vocab_size,
                                                default_seed=self.cfg.seed)
        stops = set(stop_ids)
        eos = self.tokenizer.eos_token_id
        if not ignore_eos and eos is not None:
            stops.add(eos)
        base = self.cfg.seed if seed is None else seed
        reqs = [self._make_request(p, max_new_tokens, SamplingParams(temperature, top_p, base + i),
                                   frozenset(stops)) for i, p in enumerate(prompts)]
        sched = self.scheduler = self._new_scheduler()
        for r in reqs:
            sched.add(r)
        bar = tqdm(total=len(reqs), disable=not progress, desc="requests", leave=False)
        t0 = time.perf_counter()
        while not sched.idle:
            sched.step()
            bar.update(len(sched.finished) - bar.n)
        self.device.synchronize()
        wall = time.perf_counter() - t0
        bar.close()
        self._last_stats = self._collect_stats(reqs, sched, wall)
        return [r.output_ids for r in reqs]

    def _collect_stats(self, reqs: list[Req], sched: Scheduler, wall: float) -> dict:
        s = sched.stats
        tokens = sum(len(r.output_ids) for r in reqs)
        steps = sorted(s.step_times_s)
        acc = s.accept_lens
        S = self.cfg.num_steps
        # TPOT: per request (last - first token arrival) / (tokens - 1); ITL: gaps between a
        # request's consecutive arrivals (a speculative step delivers several tokens at once).
        tpot = [(r.arrivals[-1][0] - r.arrivals[0][0]) / (len(r.output_ids) - 1)
                for r in reqs if len(r.output_ids) > 1 and r.arrivals]
        itl = [b[0] - a[0] for r in reqs for a, b in zip(r.arrivals, r.arrivals[1:])]
        spec = {}
        if self.cfg.speculative and acc:
            spec = {
                # tokens committed per verify, bonus included
                "accept_len": sum(acc) / len(acc),
                "accept_rate_per_pos": [sum(a > k for a in acc) / len(acc)
                                        for k in range(1, S + 1)],
                "accept_len_hist": {n: acc.count(n) for n in range(1, S + 2)},
                "verify_steps": s.decode_steps, "draft_steps": s.decode_steps * S,
                "simulated": self.cfg.simulated,
            }
        return {
            **spec,
            "requests": len(reqs), "tokens": tokens, "wall_s": wall,
            "tok_per_s": tokens / wall if wall > 0 else 0.0,
            "steps": s.prefill_steps + s.decode_steps, "prefill_steps": s.prefill_steps,
            "decode_steps": s.decode_steps, "retractions": s.retractions,
            "decode_tok_per_s": s.decode_tokens / s.decode_time_s if s.decode_time_s else 0.0,
            "step_time_p50_ms": 1e3 * steps[len(steps) // 2] if steps else 0.0,
            "tpot_p50_ms": _pct_ms(tpot, 50), "tpot_p90_ms": _pct_ms(tpot, 90),
            "itl_p50_ms": _pct_ms(itl, 50), "itl_p99_ms": _pct_ms(itl, 99),
            "decode_step_p50_ms": _pct_ms(s.decode_step_times_s, 50),
            "decode_step_p90_ms": _pct_ms(s.decode_step_times_s, 90),
            "overshoot_rows": s.overshoot_rows, "predrafted_steps": s.predrafted_steps,
            "host_syncs": dict(s.host_syncs),
            "finish_reasons": {k: sum(r.finished_reason == k for r in reqs)
                               for k in ("stop", "length", "abort")},
        }

    def stats(self) -> dict:
        """Figures of the last `generate` (tokens, steps, tok_per_s, ...)."""
        return dict(self._last_stats)

    def check_invariants(self) -> None:
        """Raise InvariantError naming the leak; silent when clean."""
        self.scheduler.check_identity()
        check_kv_invariants(self.allocator, self.pool, self.scheduler.live_kv(),
                            check_table=not self.device.is_cuda)

    def save_target(self, directory: Union[str, Path]) -> None:
        """HF LlamaForCausalLM-compatible config.json + model.safetensors."""
        save_model(self.model, directory)


def _pct_ms(xs: list, q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return 1e3 * xs[min(len(xs) - 1, int(len(xs) * q / 100))]


__all__ = ["Engine", "RunConfig", "ConfigError"]
