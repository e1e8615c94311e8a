"""Engine: the public entry point. Builds the model, KV memory, worker and scheduler from a
RunConfig and serves `generate` calls.

    eng = Engine(RunConfig(model="random-tiny", page_size=16))
    out = eng.generate(["def f(x):"], max_new_tokens=32)   # list[list[int]]

Lifetime: `close()` (or the end of `with Engine(cfg) as eng:`) frees everything the engine
holds; so does `del eng`, at once: nothing the engine owns refers back to it (the scheduler
calls a StepHooks object and an invariant-check partial, not engine methods), so reference
counting frees it without waiting for the cyclic garbage collector, and `__del__` closes it,
breaking the cycles inside its parts (a graph's function holds its worker).

Threads: one Engine may be shared between threads. Every public method that reads or changes
the engine's state holds the engine's one re-entrant lock, `generate` for its whole call: calls
from several threads run one after another, each returning what it would return alone.
Interleaved `step()` calls run whole steps, each advancing every request held, whichever
thread added it. A hook (`on_step`) runs under the lock on the stepping thread and may call
the engine (the lock is re-entrant).
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
import warnings
from pathlib import Path
from statistics import mean
from typing import Optional, Sequence, Union

import numpy as np

from .config import ConfigError, RunConfig
from .errors import AcceptanceAlarm, NonFiniteLogitsError
from .device import resolve_device
from .kernels.attention_ref import paged_attention_ref
from .kernels.attn_meta import check_bounds
from .kernels.fused_ops import references
from .mem.allocator import PagedAllocator
from .mem.invariants import check_kv_invariants
from .mem.kv_cache import KVCache
from .mem.kv_manager import KVManager
from .mem.req_pool import ReqToTokenPool
from .models.memory import check_memory
from .models import gemm_plan
from .models.moe import set_moe_kernels
from .models.reference import first_nonfinite, largest_weight
from .models.weights import save_model
from .progress import TokenProgress
from .atomic import atomic_path, atomic_write_text
from .instrument.session import ProfilerSession
from .instrument.spans import Spans
from .instrument.timeline import EventTimeline
from .instrument.meter import BubbleMeter, meter_throughput
from .health import ALARM_FLOOR, ALARM_WINDOW, expected_experts, run_ahead_unavailable
from .models.zoo import build_target, token_counts
from .draft_kinds import DRAFT_KINDS, parse_draft_vocab
from .models.draft_vocab import set_draft_vocab
from .models.moe import attach_recorder
from .core import Req, SamplingParams, Worker
from .sched.future_map import FutureMap
from .sched.hooks import HookHandle, StepHooks
from .loop_options import LoopOptions
from .sched.scheduler import Scheduler, StepStats
from .stats import collect_stats
from .speculative.plan import SpecParams
from .speculative.worker import SpecWorker
from .speculative.arms import ScheduleWorker
from .speculative.arms import build as build_schedule
from .speculative.arms import step_counts as schedule_step_counts
from . import spec_schedule
from .speculative.target_worker import TargetWorker
from .validate import check_generate_args, check_out_dir

Prompt = Union[str, Sequence[int]]
RUN_AHEAD_CPU = ("not available on CPU: the host runs every stage itself, so no launch can "
                 "run ahead of device work")
RUN_AHEAD_NO_METER = "needs the bubble meter (bubble_meter=True, --bubble-meter true)"
logger = logging.getLogger("mtplab")


def attention_fn(backend: str, deterministic: bool = False, check: bool = False):
    """The attention kernel of `backend`; with `check`, each call first checks its lanes'
    lengths against the forward's static bounds (attn_meta.check_bounds)."""
    if backend == "triton":
        from .kernels.triton_attention import paged_attention_triton
        fn = functools.partial(paged_attention_triton, deterministic=deterministic)
    else:
        fn = paged_attention_ref
    return functools.partial(_bounds_checked, fn) if check else fn


def _bounds_checked(attn, q, k_cache, v_cache, meta, *args, **kwargs):
    check_bounds(meta)
    return attn(q, k_cache, v_cache, meta, *args, **kwargs)


def _serialised(method):
    """`method` run holding the engine's lock (the module doc's "Threads")."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


class EngineClosedError(RuntimeError):
    """The engine was closed (close(), the end of its `with` block)."""


# what close() keeps: the figures a caller may still read (cfg, stats(), the run folder)
_KEPT_AFTER_CLOSE = ("cfg", "run_dir", "_last_stats", "profile_note", "gemm_plan", "_closed",
                     "_lock")


def _check_invariants(scheduler: Scheduler, *, allocator: PagedAllocator,
                      pool: ReqToTokenPool, check_table: bool) -> None:
    """Live-request identity, then the KV invariants (mem/invariants.py); raises
    InvariantError naming the leak. A function, not an Engine method, so the scheduler's
    debug hook (a partial of it) holds no reference to the engine."""
    scheduler.check_identity()
    check_kv_invariants(allocator, pool, scheduler.live_kv(), check_table=check_table,
                        allocated=scheduler.kv.allocated)


class Engine:
    def __init__(self, cfg: RunConfig):
        self._closed = False              # first: close() (and __del__) on a partial build
        self._lock = threading.RLock()    # held by every public method (module doc: Threads)
        if not isinstance(cfg, RunConfig):
            raise ConfigError(f"Engine takes a RunConfig, got {type(cfg).__name__}; build one "
                              "with RunConfig(model=..., ...).")
        cfg.validate()                    # a field changed since construction is checked here
        self.cfg = cfg
        self._hot: Optional[np.ndarray] = None     # a hot draft vocabulary, as a token mask
        self.run_dir = Path(cfg.trace_dir) / (cfg.run_name or time.strftime(
            f"%Y%m%d-%H%M%S-{Path(cfg.model).name}-{cfg.draft}"))
        if cfg.profile or cfg.event_timeline or cfg.bubble_meter:     # what finish() writes
            check_out_dir(self.run_dir, "the run folder (trace_dir/run_name)")
        self.device = resolve_device(cfg.device)
        check_memory(cfg, log=logger.info)        # fails with one sentence before allocating
        dev = self.device.torch_device
        model, self.tokenizer = build_target(cfg.model, cfg.seed, dev, cfg.torch_dtype,
                                             cfg.moe_routing)
        self.model = model.to(dev, cfg.torch_dtype).set_fused(cfg.fused)
        set_moe_kernels(self.model, cfg.moe_kernels)
        # before the KV pool takes the memory its measurement borrows, and before any capture
        self.gemm_plan = self._plan_gemms(self.model, "target")
        mc = self.model.config
        # before any graph is captured: the verify graphs hold the recorder's writes
        self.experts = attach_recorder(self.model) if cfg.moe_stats else None
        self._expert_steps: list[float] = []     # experts per layer of each verify so far
        P = cfg.page_size
        num_slots = (cfg.max_total_tokens // P + 1) * P          # + the padding page
        self.allocator = PagedAllocator(num_slots, P)
        self.pool = ReqToTokenPool(cfg.max_running_requests, cfg.row_width, dev,
                                    self.device.h2d)
        self.kv_cache = KVCache.allocate_layers(
            [mc.attn_shape(i) for i in range(mc.num_hidden_layers)], num_slots,
            cfg.torch_dtype, dev)
        self.kv = KVManager(self.allocator, self.pool)
        attn = attention_fn(cfg.attention_backend, cfg.deterministic, cfg.debug_invariants)
        self._start_profiling()              # before graph capture (CUPTI must see it)
        self.future_map = FutureMap(
            cfg.max_running_requests, mc.hidden_size if cfg.speculative else 0, cfg.topk,
            cfg.torch_dtype, self.device,
            with_topk=cfg.speculative and DRAFT_KINDS[cfg.draft].extend_forward,
            poison=cfg.debug_future_map)
        with self.numerics():                 # graphs capture the kernels in force
            self.target_worker = TargetWorker(
                self.model, self.kv_cache, self.pool.table, attn,
                cfg.cuda_graphs and not cfg.speculative,
                min(cfg.cuda_graph_max_bs, cfg.max_running_requests), self.future_map,
                self.spans, cfg.graph_granularity)
            self.worker: Worker = self.target_worker
            self.draft_model = None
            if cfg.speculative:
                self.worker = self._spec_worker(num_slots, attn)
        self.scheduler = self._new_scheduler()
        self._next_rid = 0
        self._last_stats: dict = {}
        self._alarms: list = []             # acceptance alarm stretches of every generate

    # -- lifetime --------------------------------------------------------------------------
    @_serialised
    def close(self) -> None:
        """Free what the engine holds: requests still held are aborted (device synchronized),
        the profiler session is stopped (its trace written if its active window began), the
        CUDA graphs, KV pool, future map, streams, pinned buffers, bubble meter and event
        timeline are released. Idempotent. Afterwards only `cfg`, `stats()` and `run_dir`
        remain, and `gemm_plan`; any other use raises EngineClosedError."""
        d = self.__dict__
        if d.get("_closed", True):             # closed already, or never built
            return
        self._closed = True
        try:
            if d.get("scheduler") is not None:
                self.scheduler.abort_all()
            if d.get("profiler") is not None:
                self.profile_note = self.profiler.stop()
        finally:
            # the cycles inside the parts: a captured graph's function holds its worker, the
            # meter caches spans that hold the meter
            for part in ("worker", "target_worker", "meter"):
                if d.get(part) is not None:
                    d[part].close()
            kept = {k: d[k] for k in _KEPT_AFTER_CLOSE if k in d}
            d.clear()
            d.update(kept)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def __del__(self):
        # `del eng` (reference counting: the engine is in no cycle) frees everything at once
        try:
            self.close()
        except Exception:           # interpreter shutdown, or a part already broken
            pass

    def __getattr__(self, name: str):
        # reached only for an attribute not found: after close() all but the figures are gone
        if self.__dict__.get("_closed"):
            raise EngineClosedError("this Engine is closed (close() or the end of its `with` "
                                    "block); build a new Engine to run more.")
        raise AttributeError(f"'Engine' object has no attribute {name!r}")

    def _spec_worker(self, num_slots: int, attn) -> SpecWorker:
        cfg, dev = self.cfg, self.device.torch_device
        kind = DRAFT_KINDS[cfg.draft]        # draft_kinds.py: only this kind is built
        model = set_draft_vocab(kind.build(self.model, cfg.seed),
                                parse_draft_vocab(cfg.draft_vocab), token_counts(self.model))
        if cfg.draft_kv_window:                  # config: only a draft reading the target's KV
            model.set_kv_window(cfg.draft_kv_window)
        draft = kind.worker.create(
            model, self.kv_cache, self.pool.table, attn,
            num_slots=num_slots, num_steps=cfg.num_steps, topk=cfg.topk,
            page_size=cfg.page_size, dtype=cfg.torch_dtype, device=dev, spans=self.spans)
        self.draft_model = draft.model.set_fused(cfg.fused)
        self.gemm_plan += self._plan_gemms(self.draft_model, "draft")
        ids = self.draft_model.vocab_ids              # a hot vocabulary: its token ids
        if ids is not None:
            self._hot = np.zeros(self.model.config.vocab_size, dtype=bool)
            self._hot[ids.cpu().numpy()] = True
        graph_max_bs = min(cfg.cuda_graph_max_bs, cfg.max_running_requests)
        if cfg.spec_schedule is not None:
            return self._schedule_worker(draft, graph_max_bs)
        params = SpecParams(num_steps=cfg.num_steps, topk=cfg.topk,
                            num_draft_tokens=cfg.num_draft_tokens, fold_seed=cfg.fold_seed,
                            simulate_accept_len=cfg.simulate_accept_len,
                            simulate_accept_rates=cfg.simulate_accept_rates,
                            **cfg.zb_options("worker"))
        return SpecWorker(self.target_worker, draft, self.future_map, params, cfg.cuda_graphs,
                          graph_max_bs, cfg.graph_granularity)

    def _plan_gemms(self, model, role: str) -> list[dict]:
        """RunConfig.decode_gemm on `model`'s GEMM sites (models/gemm_plan.py): one row per
        weight shape (model role, n, k, dtype, sites, cublas_us, triton_us, launch) where it
        applies."""
        cfg = self.cfg
        rows = gemm_plan.apply(cfg.decode_gemm, [model], self.device.torch_device,
                               cfg.torch_dtype, cfg.deterministic)
        return [{"model": role, **r} for r in rows]

    def _schedule_worker(self, draft, graph_max_bs: int) -> ScheduleWorker:
        """One arm per setting of cfg.spec_schedule, all captured now (speculative/arms.py).
        A simulated mean accept length becomes one per-position rate at the
        run's num_steps (spec_schedule.geometric_rate): a bucket of fewer steps accepts less."""
        cfg = self.cfg
        rates = cfg.simulate_accept_rates
        if cfg.simulate_accept_len is not None:
            rates = (spec_schedule.geometric_rate(cfg.simulate_accept_len, cfg.num_steps),) \
                * cfg.num_steps
        base = SpecParams(num_steps=cfg.num_steps, topk=cfg.topk,
                          num_draft_tokens=cfg.num_draft_tokens, fold_seed=cfg.fold_seed,
                          **cfg.zb_options("worker"))
        return build_schedule(self.target_worker, draft, self.future_map,
                              spec_schedule.ranges(cfg.spec_schedule), base, rates,
                              cfg.cuda_graphs, graph_max_bs, cfg.graph_granularity)

    @contextlib.contextmanager
    def numerics(self):
        """The scope of the engine's forwards (graph capture and every step):
        batch-invariant aten kernels when cfg.deterministic (kernels/batch_invariant.py), and
        with fused=False the torch bodies of every fused op (kernels/fused_ops.py), in eager
        steps and captured graphs alike. Outside it, torch's own kernels."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(references(not self.cfg.fused))
            if self.cfg.deterministic:
                from .kernels.batch_invariant import batch_invariant_mode
                stack.enter_context(batch_invariant_mode(self.device.torch_device.type))
            yield

    # -- profiling -----------------------------------------------------------------------
    def _start_profiling(self) -> None:
        cfg = self.cfg
        self.timeline = EventTimeline(self.device.is_cuda) if cfg.event_timeline else None
        self.meter = BubbleMeter(self.device.torch_device) if cfg.bubble_meter else None
        self.spans = Spans(enabled=cfg.profile or cfg.event_timeline, timeline=self.timeline,
                           annotate=cfg.profile, sample_every=cfg.event_timeline_every,
                           meter=self.meter)
        self.profiler = None
        self.profile_note: Optional[str] = None     # why finish() wrote no trace, if so
        if cfg.profile:
            self.profiler = ProfilerSession(self.run_dir, wait=cfg.profile_wait,
                                            warmup=cfg.profile_warmup, active=cfg.profile_active,
                                            cuda=self.device.is_cuda)
            self.profiler.start()
        # on_step hooks, then the profiler's step boundary (no reference to the engine)
        self._hooks = StepHooks(self.profiler)

    @_serialised
    def finish(self) -> dict:
        """Stop profiling and write the run folder: manifest.json, health.json (when the
        acceptance alarm fired: its stretches), the Kineto trace(s) and timeline.parquet,
        meter.parquet + meter_stages.parquet (atomically). Returns
        {name: path} of what was written."""
        written = {}
        self.profile_note = None
        if self.profiler is not None:
            self.profile_note = self.profiler.stop()
            if self.profile_note:
                logger.warning(self.profile_note)
            written.update({f"trace{i}": p for i, p in enumerate(self.profiler.traces)})
        if self.timeline is not None:
            with atomic_path(self.run_dir / "timeline.parquet") as tmp:
                self.timeline.to_frame().to_parquet(tmp)
            written["timeline"] = self.run_dir / "timeline.parquet"
        if self.meter is not None:
            self.meter.collect()
            for key, df in (("meter", self.meter_frame()), ("meter_stages",
                                                            self.meter.stages_frame())):
                with atomic_path(self.run_dir / f"{key}.parquet") as tmp:
                    df.to_parquet(tmp)
                written[key] = self.run_dir / f"{key}.parquet"
        if written or self.profiler is not None:
            written["manifest"] = atomic_write_text(self.run_dir / "manifest.json",
                                                    json.dumps(self.cfg.manifest(), indent=2))
            if self._alarms:
                # the acceptance alarm's stretches (scheduler iterations = the event
                # timeline's steps): `mtplab plot RUN_DIR` shades them
                written["health"] = atomic_write_text(self.run_dir / "health.json", json.dumps(
                    {"accept_alarm_steps": self._alarms}))
        return written

    @_serialised
    def timeline_frame(self):
        """The event timeline so far (pandas DataFrame; see instrument/timeline.py)."""
        if self.timeline is None:
            raise RuntimeError("the event timeline is off; construct with event_timeline=True.")
        return self.timeline.to_frame()

    @_serialised
    def meter_frame(self, stages: bool = False):
        """The bubble meter's table so far: one row per step (wall_us, busy_us, bubble_us,
        bubble_frac, launch_lead_us, draft_share, ...; with moe_stats `experts`, the distinct
        experts per MoE layer of each decode step's verify), or with `stages=True` one row
        per stage interval (instrument/meter.py)."""
        if self.meter is None:
            raise RuntimeError("the bubble meter is off; construct with bubble_meter=True.")
        self.meter.collect()
        if stages:
            return self.meter.stages_frame()
        df = self.meter.frame()
        dec = df["name"].str.startswith("step[decode").to_numpy()
        if self.experts is not None and dec.sum() == len(self._expert_steps):
            df.loc[dec, "experts"] = self._expert_steps    # moe_stats: per verify, per layer
        return df

    @_serialised
    def on_step(self, fn) -> HookHandle:
        """Call `fn(step_index)` after every engine step (the scheduler's iteration that
        launched work), e.g. to plant a host delay or sample a figure per step; the index
        counts from 0 per Engine. Hooks run in the order added, on the engine's thread, before
        the profiler's step boundary (work they queue belongs to this step in both tools).
        Returns a handle: `handle.remove()` takes the hook off. A hook that raises is removed
        and its error raised once as StepHookError (sched/hooks.py); later steps run without
        it."""
        return self._hooks.add(fn)

    def _new_scheduler(self) -> Scheduler:
        hook = functools.partial(_check_invariants, allocator=self.allocator, pool=self.pool,
                                 check_table=not self.device.is_cuda) \
            if self.cfg.debug_invariants else None
        return Scheduler(self.worker, self.kv, self.future_map, self.device,
                         max_running=self.cfg.max_running_requests,
                         spans=self.spans,
                         on_step=self._hooks,
                         reserve_per_decode=self.cfg.reserve_per_decode,
                         alloc_len_per_decode=self.cfg.alloc_len_per_decode,
                         tokens_per_decode=self.cfg.tokens_per_decode, on_iteration=hook,
                         chunked_prefill_size=self.cfg.chunked_prefill_size,
                         loop=LoopOptions(overlap=self.cfg.overlap,
                                          debug_syncs=self.cfg.debug_syncs,
                                          **self.cfg.zb_options("loop")))

    # -- requests: the step-level API -----------------------------------------------------
    @_serialised
    def add_request(self, prompt: Prompt, max_new_tokens: int = 32, *, temperature: float = 0.0,
                    top_p: float = 1.0, seed: Optional[int] = None,
                    stop_ids: Optional[Sequence[int]] = None, ignore_eos: bool = False) -> Req:
        """Queue one request (token ids or a string); returns its handle (`.rid`,
        `.output_ids`, `.finished_reason`), filled in as `step()` runs it. The arguments are
        checked as `generate` checks them (validate.check_generate_args)."""
        (prompt,), stop_ids = self._check_args([prompt], max_new_tokens, temperature, top_p,
                                               seed, stop_ids, ignore_eos, False)
        req = self._make_request(prompt, max_new_tokens, temperature=temperature, top_p=top_p,
                                 seed=self.cfg.seed if seed is None else seed,
                                 stop_ids=stop_ids, ignore_eos=ignore_eos)
        self.scheduler.add(req)
        return req

    @_serialised
    def step(self) -> list[Req]:
        """One scheduler iteration (a prefill or a decode step); returns the requests it
        finished (`.rid`, `.output_ids`, `.finished_reason`). An error or Ctrl-C inside the
        step aborts every request held and frees their KV before it propagates."""
        with self.numerics():
            return self._step()

    def _step(self) -> list[Req]:
        """One scheduler iteration inside the numerics scope (entered once by the caller,
        not per step: it is on the hot path of generate)."""
        try:
            return self.scheduler.step()
        except NonFiniteLogitsError as e:
            self.scheduler.abort_all()
            raise NonFiniteLogitsError(self._nonfinite_message(e), e.rid, e.tokens) from None
        except BaseException:
            self.scheduler.abort_all()
            raise

    def _nonfinite_message(self, e: NonFiniteLogitsError) -> str:
        """The scheduler's finding plus where a dense forward of the request's tokens first
        stops being finite (models/reference.py), in one sentence."""
        ids = list(e.tokens)
        part = first_nonfinite(self.model, ids)
        name, size = largest_weight(self.model)
        if part is None:
            return (f"{e}, yet a dense forward of its {len(ids)} tokens is finite at every "
                    "layer, so the engine's state (KV cache, future map) is at fault, not "
                    "the weights; rerun with debug_invariants=True.")
        return (f"{e}: in a dense forward of its {len(ids)} tokens the values first stop "
                f"being finite at the output of {part} (the largest weight is {name} = "
                f"{size:.3g}); check the model's weights and dtype.")

    @_serialised
    def abort(self, req: Union[Req, int]) -> bool:
        """End a request now and free its KV (its output so far stays): its handle (what
        add_request returned) or its rid. False once it is finished or gone."""
        if isinstance(req, bool) or not isinstance(req, (Req, int)):
            raise TypeError(f"abort takes a request handle (from add_request) or its rid "
                            f"(int); got {type(req).__name__}.")
        return self.scheduler.abort(req)

    @property
    @_serialised
    def idle(self) -> bool:
        """No request waiting, running or in flight."""
        return self.scheduler.idle

    def _check_args(self, prompts, max_new_tokens, temperature, top_p, seed, stop_ids,
                    ignore_eos, progress) -> tuple[list, list[int]]:
        """validate.check_generate_args against this engine's vocabulary and config seed:
        (prompts as str or list[int], stop ids as list[int]); raises before anything is queued."""
        return check_generate_args(prompts, max_new_tokens, temperature, top_p, seed, stop_ids,
                                   ignore_eos, progress, vocab_size=self.model.config.vocab_size,
                                   default_seed=self.cfg.seed)

    def _make_request(self, prompt: Prompt, max_new_tokens: int, *, temperature: float,
                      top_p: float, seed: int, stop_ids, ignore_eos: bool) -> Req:
        """A Req from arguments already checked by `_check_args` (types, max_new_tokens,
        sampling, seeds, token ids); what is left depends on the prompt's tokens."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("a prompt must hold at least one token.")
        V = self.model.config.vocab_size
        if min(ids) < 0 or max(ids) >= V:
            raise ValueError(f"prompt token ids must lie in [0, {V}); got {min(ids)}..{max(ids)}.")
        if len(ids) + max_new_tokens > self.cfg.context_len:
            raise ValueError(f"prompt of {len(ids)} tokens + max_new_tokens={max_new_tokens} "
                             f"exceeds context_len={self.cfg.context_len}; shorten the prompt, "
                             "lower max_new_tokens or raise context_len.")
        stops = set(stop_ids or ())
        eos = self.tokenizer.eos_token_id
        if not ignore_eos and eos is not None:
            stops.add(eos)
        rid = self._next_rid
        self._next_rid += 1
        return Req(rid, ids, max_new_tokens, SamplingParams(temperature, top_p, seed),
                   frozenset(stops))

    @_serialised
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 32, *,
                 temperature: float = 0.0, top_p: float = 1.0, seed: Optional[int] = None,
                 stop_ids: Optional[Sequence[int]] = None, ignore_eos: bool = False,
                 progress: bool = False) -> list[list[int]]:
        """Generate for every prompt (token-id lists or strings); returns output ids in order.
        Greedy when temperature == 0. Each request i samples with seed `seed + i` (default:
        the config seed). Stops at EOS (unless ignore_eos), at `stop_ids`, or at the limit.
        Every argument and request is validated before any is queued; an error or Ctrl-C
        inside a step aborts them all and frees their KV before it propagates (the engine
        stays usable)."""
        prompts, stop_ids = self._check_args(prompts, max_new_tokens, temperature, top_p, seed,
                                             stop_ids, ignore_eos, progress)
        base = self.cfg.seed if seed is None else seed
        reqs = [self._make_request(p, max_new_tokens, temperature=temperature, top_p=top_p,
                                   seed=base + i, stop_ids=stop_ids, ignore_eos=ignore_eos)
                for i, p in enumerate(prompts)]
        sched = self.scheduler
        sched.stats = StepStats()
        for r in reqs:
            sched.add(r)
        bar = TokenProgress(len(reqs) * max_new_tokens, len(reqs), enabled=progress)
        first_meter_step = self.meter.step + 1 if self.meter is not None else 0
        if self.experts is not None:
            self.experts.reset()
        arm_steps = dict(getattr(self.worker, "steps", {}))      # a spec_schedule's arms
        t0 = time.perf_counter()
        try:
            with self.numerics():
                while not sched.idle:
                    self._step()
                    if progress:
                        bar.update(sum(len(r.output_ids) for r in reqs),
                                   sum(r.finished for r in reqs))
            self.device.synchronize()
        finally:
            bar.close()
            if self.meter is not None:
                self.meter.cut()          # the next generate's first launch is not its successor
        wall = time.perf_counter() - t0
        cfg = self.cfg
        self._last_stats = collect_stats(reqs, sched.stats, wall, num_steps=cfg.num_steps,
                                         speculative=cfg.speculative, simulated=cfg.simulated,
                                         hot=self._hot)
        self._warn_alarm(self._last_stats.get("accept_alarm_steps"))
        self._alarms += self._last_stats.get("accept_alarm_steps", [])
        self._last_stats.update(self._expert_stats(sched.stats))
        if cfg.spec_schedule is not None and self._last_stats.get("verify_steps"):
            self._last_stats.update(schedule_step_counts(arm_steps, self.worker.steps))
        if self.meter is not None:
            self.meter.collect()
            m = self.meter.summary(first_meter_step)
            m["meter_tok_per_s"] = meter_throughput(m, sched.stats.decode_tokens)
            m["meter_clock"] = "device" if self.device.is_cuda else "host"    # CPU: no device
            if not self.device.is_cuda:          # host stamps: nothing to run ahead of
                m.update(run_ahead_unavailable(), run_ahead_note=RUN_AHEAD_CPU)
            self._last_stats.update(m)
        else:
            self._last_stats.update(run_ahead_unavailable(), run_ahead_note=RUN_AHEAD_NO_METER)
        return [r.output_ids for r in reqs]

    def _expert_stats(self, s: StepStats) -> dict:
        """experts_per_verify (distinct experts per MoE layer per verify, mean over the
        generate's verifies; one host read of the recorder, after the generate) against
        experts_per_verify_uniform (health.expected_experts at each verify's bs x D tokens);
        experts_per_draft_step: the drafts have no MoE layer. Empty without moe_stats."""
        nan = float("nan")
        if not self.cfg.moe_stats:
            return {}
        if self.experts is None:
            return {"experts_per_verify": nan, "experts_per_verify_uniform": nan,
                    "experts_per_draft_step": nan, "experts_note": "a dense target"}
        rows = self.verify_experts(s)
        self._expert_steps += [per for _, per, _ in rows]
        return {"experts_per_verify": mean([per for _, per, _ in rows]) if rows else nan,
                "experts_per_verify_uniform": mean([u for *_, u in rows]) if rows else nan,
                "experts_per_draft_step": nan,
                "experts_note": "the draft's layers are dense: no experts per draft step"}

    def verify_experts(self, s: Optional[StepStats] = None) -> list[tuple[int, float, float]]:
        """Per verify recorded since the recorder's last reset (a generate resets it; s: its
        StepStats, default the scheduler's): (live lanes, distinct experts per MoE layer,
        health.expected_experts at its lanes x D tokens). One host read of the recorder;
        needs moe_stats and an MoE target."""
        if self.experts is None:
            raise RuntimeError("no expert recorder: construct with moe_stats=True on an MoE "
                               "target.")
        s = self.scheduler.stats if s is None else s
        moe = self.model.config
        return [(lanes, sum(r) / len(r),
                 expected_experts(moe.num_experts, moe.num_experts_per_tok,
                                  lanes * (1 + prop // max(lanes, 1))))
                for r, (_, lanes, _, prop) in zip(self.experts.read(), s.verify_steps)]

    @staticmethod
    def _warn_alarm(stretches) -> None:
        """An AcceptanceAlarm warning (and a log line) naming the stretches of collapsed
        acceptance, if any."""
        if not stretches:
            return
        where = ", ".join(f"{a}..{b}" for a, b in stretches[:4])
        msg = (f"acceptance collapsed over {len(stretches)} stretch(es) of the run (scheduler "
               f"iterations {where}): windows of {ALARM_WINDOW} verify steps accepted < "
               f"{ALARM_FLOOR:.0%} of the run's mean, or nothing; check the draft's inputs "
               "(stats()['accept_len_by_ctx'] shows whether it follows the context length).")
        logger.warning(msg)
        warnings.warn(msg, AcceptanceAlarm, stacklevel=3)


    @_serialised
    def stats(self) -> dict:
        """Figures of the last `generate` (tokens, steps, tok_per_s, ...); with the bubble
        meter also its figures (bubble_frac, ...) and `meter_clock`, the clock it stamped:
        `device`, or `host` on CPU (no device to stamp: time between stage spans)."""
        return dict(self._last_stats)

    @_serialised
    def check_invariants(self) -> None:
        """Raise InvariantError naming the leak; silent when clean."""
        _check_invariants(self.scheduler, allocator=self.allocator, pool=self.pool,
                          check_table=not self.device.is_cuda)

    @_serialised
    def save_target(self, directory: Union[str, Path]) -> Path:
        """HF LlamaForCausalLM-compatible config.json + model.safetensors in `directory`
        (made if missing; checked before anything is written: ConfigError); returns it."""
        out = check_out_dir(directory, "save_target's folder")
        save_model(self.model, out)
        return out


__all__ = ["Engine", "EngineClosedError", "RunConfig", "ConfigError"]
