"""RunConfig: every knob of an mtplab run, validated at construction, plus the manifest.

Construction (and `validate()`, which `Engine()` calls again) resolves every 'auto' to what is
in force on this machine (device, dtype, attention backend, CUDA graphs, context length, KV
budget), so `asdict(cfg)` *is* the resolved configuration. Invalid values raise `ConfigError`
with one sentence naming the fix: first every field against its declared type (one generic
check, mtplab/validate.py: a new knob is covered by its annotation), then ranges (`_MIN`), then
the relations between knobs.
"""
from __future__ import annotations

import platform
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata
from typing import Optional, Union

from . import spec_schedule
from .draft_kinds import DRAFT_CHOICES, DRAFT_KINDS, NO_DRAFT, kinds_where, parse_draft_vocab
from .errors import ConfigError, ModelLoadError
from .provenance import git_commit
from .validate import (check_device, check_fields, check_min, check_run_name, check_seed,
                       is_real)
from .zero_bubble import ZB_SUBKNOBS, ZeroBubbleKnobs
from .zero_bubble import options as zb_options

DRAFTS = DRAFT_CHOICES          # "none" and the rows of the draft table (draft_kinds.py)
DTYPES = ("auto", "float32", "bfloat16", "float16")
BACKENDS = ("auto", "torch", "triton")
GRANULARITIES = ("stage", "step")
MOE_KERNELS = ("grouped", "split")       # = models/moe.py MOE_KERNELS (tests/models/test_moe.py)
DECODE_GEMMS = ("auto", "cublas")        # = models/gemm_plan.py (tests/models/test_gemm_plan.py)


def knob(default, help: str, choices: Optional[tuple] = None):
    """A RunConfig field with its one-line meaning (and allowed values) as metadata:
    `mtplab run --help` is built from it, so the meaning lives in one place."""
    meta = {"help": help} if choices is None else {"help": help, "choices": choices}
    return field(default=default, metadata=meta)


# Smallest allowed value per numeric field (None, an unset Optional, always passes).
_MIN = {"num_steps": 1, "topk": 1, "page_size": 1, "max_running_requests": 1,
        "cuda_graph_max_bs": 1, "profile_active": 1, "event_timeline_every": 1,
        "profile_wait": 0, "profile_warmup": 0, "layers": 1, "num_draft_tokens": 1,
        "max_total_tokens": 1, "context_len": 2, "chunked_prefill_size": 1}


@dataclass
class RunConfig(ZeroBubbleKnobs):
    # zero_bubble and its zb_* sub-knobs: ZeroBubbleKnobs (zero_bubble.py), first in field order
    # model and draft
    model: str = knob("random-tiny", "a zoo preset (tiny-code: trained, real acceptance; "
                      "random-tiny, random-medium, *-like shape presets) or a local HF Llama dir")
    layers: Optional[int] = knob(None, "depth of a shape preset (model becomes <preset>@<layers>)")
    moe_routing: str = knob("uniform", "router of a random MoE preset: uniform | zipf:<s> "
                            "(expert e's weight scaled by its rank^-s; models/zoo.py)")
    draft: str = knob("none", " | ".join(["none"] + [f"{k.name} ({k.help})"
                                                     for k in DRAFT_KINDS.values()]), DRAFTS)
    draft_vocab: str = knob("full", "the draft head's vocabulary: full | hot:<N> (the N most "
                            "frequent tokens, FR-Spec) | centroids:<C>/<k> (k of C token "
                            "clusters per row); models/draft_vocab.py")
    draft_kv_window: int = knob(0, "KV entries of the target's cache a draft reading it "
                                "(frozen_kv_mtp, gemma4_assistant) attends: the last N of "
                                "the context (a sliding window; MagicDec's draft also keeps "
                                "sink tokens); 0: all the layer reads")
    num_steps: int = knob(3, "S: draft steps per iteration")
    topk: int = knob(1, "K: branches per draft step")
    num_draft_tokens: Optional[int] = knob(None, "D: tree nodes incl. the root "
                                           "(None: S+1 for K=1, else S*K+1)")
    spec_schedule: Optional[Union[dict, str]] = knob(
        None, "draft setting per decode batch size: {bs_upper: (num_steps, topk) | off, ...}, "
        "'4:3x1,16:2x1,32:off' or a YAML file (mtplab bench --groups schedule writes one); "
        "num_steps/topk bound every bucket, the last bucket is max_running_requests; "
        "spec_schedule.py (None: num_steps/topk at every batch size)")
    # memory and scheduling
    page_size: int = knob(1, "P: KV page size, a power of two")
    max_running_requests: int = knob(32, "decode batch limit (= req_to_token rows)")
    max_total_tokens: Optional[int] = knob(None, "KV budget in token slots "
                                           "(None: fits every row at full context)")
    context_len: Optional[int] = knob(None, "longest prompt + output "
                                      "(None: the model's max_position_embeddings)")
    chunked_prefill_size: Optional[int] = knob(8192, "most prompt tokens one prefill forward "
                                               "feeds: a longer prompt is prefilled in chunks "
                                               "(prefill memory stays bounded; None: whole "
                                               "prompts)")
    # scheduling ablations
    overlap: bool = knob(False, "overlap scheduler: launch step k+1 before processing k")
    fold_seed: bool = knob(False, "run the Frozen-KV seed step inside the draft graph")
    cuda_graphs: Optional[bool] = knob(None, "decode stages as CUDA graph replays "
                                       "(None: True on CUDA, False on CPU)")
    cuda_graph_max_bs: int = knob(32, "largest captured batch bucket")
    graph_granularity: str = knob("stage", "decode CUDA graphs: one per segment (stage) or "
                                  "resolve..stash of a step as one graph (step)", GRANULARITIES)
    attention_backend: str = knob("auto", "attention kernels (auto: triton on CUDA, torch on CPU)",
                                  BACKENDS)
    fused: Optional[bool] = knob(None, "fused decoder layer (one QKV and one gate/up GEMM, "
                                 "add+RMSNorm, RoPE+KV write, SiLU*mul) and single-kernel "
                                 "tree/accept stages (None: True on CUDA, False on CPU)")
    moe_kernels: str = knob("grouped", "an MoE target's fused FFN: grouped (router, softmax, "
                            "top-k and expert alignment in one kernel; one grouped GEMM pair "
                            "over the touched experts with the shared expert in it) | split "
                            "(torch routing, the shared expert's own GEMMs); models/moe.py",
                            MOE_KERNELS)
    decode_gemm: str = knob("auto", "GEMMs of at most 8 rows (decode, draft steps, small "
                            "verifies): auto (per weight shape, the skinny Triton GEMM where it "
                            "measured faster than cuBLAS on this device at engine build; bf16/"
                            "fp16 on CUDA, not deterministic) | cublas; models/gemm_plan.py",
                            DECODE_GEMMS)
    simulate_accept_len: Optional[float] = knob(None, "simulated mean tokens per verify, bonus "
                                                "incl. (target and draft still run)")
    simulate_accept_rates: Optional[tuple] = knob(None, "or simulated per-position acceptance "
                                                  "rates, num_steps values in [0, 1]")
    # device and numerics
    device: str = knob("auto", "auto | cpu | cuda | cuda:N (auto: cuda when present)")
    dtype: str = knob("auto", "weights and activations (auto: bfloat16 on CUDA, float32 on CPU)",
                      DTYPES)
    deterministic: bool = knob(False, "batch-invariant kernels: greedy spec == target-only "
                               "token for token at any batch size (docs/deterministic.md)")
    seed: int = knob(0, "weights of random presets and the sampling seed base")
    # profiling and debugging
    profile: bool = knob(False, "torch.profiler session; Kineto trace under trace_dir/run_name/")
    profile_wait: int = knob(2, "profiler schedule: engine steps skipped before warm-up")
    profile_warmup: int = knob(2, "profiler schedule: warm-up steps (collected, then dropped)")
    profile_active: int = knob(8, "profiler schedule: engine steps recorded in the trace")
    event_timeline: bool = knob(False, "always-on CUDA-event timeline (timeline.parquet), "
                                "no profiler")
    event_timeline_every: int = knob(1, "timeline spans on every N-th engine step only")
    bubble_meter: bool = knob(False, "GPU time stamps at stage boundaries: per-step wall, stage "
                              "intervals and bubble without the profiler (meter.parquet)")
    moe_stats: bool = knob(False, "MoE target: record the distinct experts each verify's "
                           "tokens touch per layer, on the device (a few small kernels per MoE "
                           "layer; experts_per_verify in stats)")
    trace_dir: str = knob("traces", "output root of run folders")
    run_name: Optional[str] = knob(None, "run folder under trace_dir "
                                   "(None: named after the time, model and draft)")
    debug_invariants: bool = knob(False, "run the KV invariant check after every iteration; "
                                  "check every attention call's kv_len <= max_kv")
    debug_future_map: bool = knob(False, "poison consumed future-map rows (consume-once check)")
    debug_syncs: bool = knob(False, "list host syncs per step (CUDA sync debug mode)")

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Every check of construction, again (resolving is idempotent): `Engine()` calls it,
        so a field changed after construction (`cfg.topk = 0`) is refused there as it would
        be here."""
        check_fields(self)
        check_min(self, _MIN)
        self._validate_static()
        self._resolve()

    # -- validation --------------------------------------------------------------------
    def _validate_static(self):
        if not self.model.strip():
            raise ConfigError("model is empty; name a preset (e.g. 'random-tiny') or a model "
                              "directory.")
        if self.draft != NO_DRAFT and self.draft not in DRAFT_KINDS:
            raise ConfigError(f"draft={self.draft!r} is unknown; use one of "
                              f"{(NO_DRAFT, *DRAFT_KINDS)}.")
        check_device(self.device)
        check_run_name(self.run_name)
        try:
            check_seed("seed", self.seed)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        P = self.page_size
        if P & (P - 1):
            raise ConfigError(f"page_size={P} is not a power of two; use 1, 2, 4, 8, 16, ...")
        D = self.num_draft_tokens
        if D is not None:
            if self.topk > D:
                raise ConfigError(f"topk={self.topk} is larger than num_draft_tokens={D}; "
                                  "num_draft_tokens must be at least topk.")
            if self.topk == 1 and D != self.num_steps + 1:
                raise ConfigError(f"with topk=1 the draft is a chain of num_steps+1 tokens, so "
                                  f"num_draft_tokens must be {self.num_steps + 1}, got {D}.")
            if D > self.num_steps * self.topk + 1:
                raise ConfigError(f"num_draft_tokens={D} exceeds the "
                                  f"{self.num_steps * self.topk + 1} nodes the draft can "
                                  "propose (num_steps*topk+1).")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r} is unknown; use one of {DTYPES}.")
        if self.moe_kernels not in MOE_KERNELS:
            raise ConfigError(f"moe_kernels={self.moe_kernels!r} is unknown; use one of "
                              f"{MOE_KERNELS}.")
        if self.decode_gemm not in DECODE_GEMMS:
            raise ConfigError(f"decode_gemm={self.decode_gemm!r} is unknown; use one of "
                              f"{DECODE_GEMMS}.")
        if self.graph_granularity not in GRANULARITIES:
            raise ConfigError(f"graph_granularity={self.graph_granularity!r} is unknown; use "
                              f"one of {GRANULARITIES}.")
        if self.attention_backend not in BACKENDS:
            raise ConfigError(f"attention_backend={self.attention_backend!r} is unknown; "
                              f"use one of {BACKENDS}.")
        if self.fold_seed and not (self.speculative and DRAFT_KINDS[self.draft].seed_forward):
            need = " or ".join(f"draft={k!r}" for k in kinds_where(seed_forward=True))
            raise ConfigError("fold_seed folds the draft's seed forward into the draft graph; "
                              f"it needs {need}.")
        self._check_spec_schedule()
        sim = self.simulate_accept_len is not None or self.simulate_accept_rates is not None
        if sim and not self.speculative:
            raise ConfigError(f"simulated acceptance needs a draft; set draft to one of "
                              f"{list(DRAFT_KINDS)}.")
        if self.simulate_accept_len is not None and self.simulate_accept_rates is not None:
            raise ConfigError("give simulate_accept_len or simulate_accept_rates, not both.")
        if self.simulate_accept_len is not None and \
                not 1.0 <= self.simulate_accept_len <= self.num_steps + 1:
            raise ConfigError(f"simulate_accept_len={self.simulate_accept_len} must lie in "
                              f"[1, num_steps+1={self.num_steps + 1}] (tokens per verify).")
        if self.simulate_accept_rates is not None:
            rates = self.simulate_accept_rates
            if not all(is_real(r) for r in rates):
                raise ConfigError(f"simulate_accept_rates={rates!r} must hold numbers, e.g. "
                                  "(0.8, 0.6, 0.4).")
            self.simulate_accept_rates = tuple(float(r) for r in rates)
            if len(self.simulate_accept_rates) != self.num_steps or \
                    not all(0 <= r <= 1 for r in self.simulate_accept_rates):
                raise ConfigError(f"simulate_accept_rates needs num_steps={self.num_steps} "
                                  "probabilities in [0, 1].")

    def _check_spec_schedule(self) -> None:
        if self.spec_schedule is None:
            return
        if not self.speculative:
            raise ConfigError("spec_schedule picks a draft setting per batch size; it needs a "
                              f"draft (draft one of {list(DRAFT_KINDS)}).")
        self.spec_schedule = spec_schedule.parse(self.spec_schedule)
        spec_schedule.check(self.spec_schedule, num_steps=self.num_steps, topk=self.topk,
                            max_running_requests=self.max_running_requests)
        D, full = self.num_draft_tokens, (self.num_steps + 1 if self.topk == 1
                                          else self.num_steps * self.topk + 1)
        if D is not None and D != full:
            raise ConfigError(f"with spec_schedule each bucket verifies every node its draft "
                              f"proposes (S+1 for topk 1, S*K+1 else); num_draft_tokens={D} "
                              f"cannot apply to every bucket: leave it unset.")

    def _resolve(self):
        from . import lazy_triton
        from .device import resolve_device
        from .models.zoo import check_draft_shipped, model_config, with_layers

        try:
            dev = resolve_device(self.device)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.device = str(dev.torch_device)
        if self.dtype == "auto":
            self.dtype = "bfloat16" if dev.is_cuda else "float32"
        try:
            interp = lazy_triton.interpreting()
        except lazy_triton.TritonModeError as e:
            raise ConfigError(str(e)) from None
        if self.deterministic and not dev.is_cuda and not interp:
            raise ConfigError("deterministic=True on CPU runs the Triton kernels under the "
                              "interpreter: set TRITON_INTERPRET=1 before starting Python.")
        if self.attention_backend == "auto":
            self.attention_backend = ("triton" if (dev.is_cuda and lazy_triton.available())
                                      or self.deterministic else "torch")
        if (self.attention_backend == "triton" or self.deterministic) \
                and not lazy_triton.available():
            raise ConfigError(f"attention_backend='triton' and deterministic=True run Triton "
                              f"kernels and the triton package is not installed: "
                              f"{lazy_triton.INSTALL}, or use attention_backend='torch'.")
        if self.deterministic and self.attention_backend != "triton":
            raise ConfigError("deterministic=True needs attention_backend='triton' (the torch "
                              "reference attention is not batch-invariant).")
        if self.attention_backend == "triton" and not dev.is_cuda and not interp:
            raise ConfigError("attention_backend='triton' on CPU needs the Triton interpreter: "
                              "set TRITON_INTERPRET=1 before starting Python, or use 'torch'.")
        self._resolve_zero_bubble()
        if self.cuda_graphs is None:
            self.cuda_graphs = dev.is_cuda
        if self.fused is None:
            self.fused = dev.is_cuda
        if self.cuda_graphs and not dev.is_cuda:
            raise ConfigError("cuda_graphs=True needs a CUDA device; set cuda_graphs=False on CPU.")
        if self.cuda_graphs and self.graph_granularity == "step" and self.debug_future_map:
            raise ConfigError("graph_granularity='step' captures resolve inside the step graph, "
                              "and debug_future_map's consume-once check syncs there; use "
                              "graph_granularity='stage' with debug_future_map.")
        if self.num_draft_tokens is None:
            self.num_draft_tokens = (self.num_steps + 1 if self.topk == 1
                                     else self.num_steps * self.topk + 1)
        try:
            if self.layers is not None:
                self.model = with_layers(self.model, self.layers)
            mcfg = model_config(self.model)
        except ModelLoadError:
            raise
        except (ValueError, OSError) as e:
            raise ConfigError(str(e)) from None
        self._check_moe_routing(mcfg)
        if self.speculative:
            try:
                check_draft_shipped(self.model, self.draft)
            except ValueError as e:
                raise ConfigError(f"draft={self.draft!r}: {e}.") from None
        self._check_draft_vocab(mcfg.vocab_size)
        self._check_draft_kv_window()
        need = DRAFT_KINDS[self.draft].min_target_layers if self.speculative else 1
        if mcfg.num_hidden_layers < need:
            raise ConfigError(f"draft={self.draft!r} reads {need} target layers and "
                              f"{self.model} has {mcfg.num_hidden_layers}; choose a deeper "
                              "model (--layers) or another draft.")
        if self.topk > mcfg.vocab_size:
            raise ConfigError(f"topk={self.topk} is larger than the vocabulary of {self.model} "
                              f"({mcfg.vocab_size} tokens); use topk <= {mcfg.vocab_size}.")
        if self.context_len is None:
            self.context_len = mcfg.max_position_embeddings
        if self.context_len > mcfg.max_position_embeddings:
            raise ConfigError(f"context_len={self.context_len} exceeds the model's "
                              f"max_position_embeddings={mcfg.max_position_embeddings}.")
        W = self.row_width
        if self.max_total_tokens is None:
            self.max_total_tokens = self.max_running_requests * W
        if self.max_total_tokens < W:
            raise ConfigError(f"max_total_tokens={self.max_total_tokens} cannot hold even one "
                              f"request at context_len={self.context_len} (a row needs {W} "
                              "slots); raise max_total_tokens or lower context_len.")

    def _check_draft_vocab(self, V: int) -> None:
        try:
            dv = parse_draft_vocab(self.draft_vocab)
        except ValueError as e:
            raise ConfigError(f"{e}.") from None
        if dv.kind != "full" and not self.speculative:
            raise ConfigError(f"draft_vocab={self.draft_vocab!r} shapes a draft's head; it "
                              "needs a draft (or leave draft_vocab='full').")
        if dv.kind == "hot" and not self.topk <= dv.size <= V:
            raise ConfigError(f"draft_vocab={self.draft_vocab!r} keeps {dv.size} tokens; it "
                              f"must lie in [topk={self.topk}, vocab {V}].")
        if dv.kind == "centroids":
            C, k = dv.clusters, dv.top
            if C & (C - 1) or V % C or k > C or k * (V // C) < self.topk:
                raise ConfigError(
                    f"draft_vocab={self.draft_vocab!r}: C must be a power of two dividing the "
                    f"vocabulary ({V}), k <= C, and k*V/C >= topk={self.topk}.")

    def _check_draft_kv_window(self) -> None:
        n = self.draft_kv_window
        if n < 0:
            raise ConfigError(f"draft_kv_window={n} must be >= 0 (0: the draft attends all "
                              "the context its layer reads).")
        if n and (not self.speculative or DRAFT_KINDS[self.draft].owns_kv):
            kinds = ", ".join(kinds_where(owns_kv=False))
            raise ConfigError(f"draft_kv_window={n} bounds a draft that reads the target's KV "
                              f"({kinds}), and draft={self.draft!r}; choose such a draft or "
                              "leave draft_kv_window=0.")

    def _check_moe_routing(self, mcfg) -> None:
        from .models.llama_config import routing_skew
        from .models.zoo import is_random_preset
        try:
            skew = routing_skew(self.moe_routing)
        except ValueError as e:
            raise ConfigError(f"{e}.") from None
        if skew and not (mcfg.is_moe and is_random_preset(self.model)):
            raise ConfigError(f"moe_routing={self.moe_routing!r} skews the router of a random "
                              f"MoE preset, and {self.model} is not one; use moe_routing="
                              "'uniform' or an MoE preset (random-tiny-moe, "
                              "gemma4-26b-a4b-like).")

    def _resolve_zero_bubble(self):
        """zero_bubble turns every sub-knob on; a None sub-knob follows it, or takes its
        `auto` value with zero_bubble off (zero_bubble.py). Without a draft the worker's
        sub-knobs resolve to False."""
        subs = ZB_SUBKNOBS.items()
        if self.zero_bubble:
            # resolved without a draft, a worker sub-knob is False: re-resolving keeps it valid
            off = [n for n, k in subs if getattr(self, n) is False
                   and (k.owner != "worker" or self.speculative)]
            if off:
                raise ConfigError(f"zero_bubble=True turns on {', '.join(ZB_SUBKNOBS)}; {off} "
                                  "set to False contradicts it (use zero_bubble=False and pick "
                                  "sub-knobs).")
        for n, k in subs:
            if k.owner == "worker" and getattr(self, n) and not self.speculative \
                    and not self.zero_bubble:
                raise ConfigError(f"{n} acts in the speculative worker; it needs a draft "
                                  f"(draft one of {list(DRAFT_KINDS)}).")
            if getattr(self, n) is None:
                setattr(self, n, self.zero_bubble or k.auto)
            if k.owner == "worker" and not self.speculative:
                setattr(self, n, False)

    def zb_options(self, owner: str) -> dict:
        """The resolved zero-bubble sub-knobs `owner` ("loop" or "worker") acts on, as its
        field names (LoopOptions, SpecParams)."""
        return zb_options({n: getattr(self, n) for n in ZB_SUBKNOBS}, owner)

    # -- derived sizes (docs/design.md "KV memory") -------------------------------------------
    @property
    def speculative(self) -> bool:
        return self.draft != NO_DRAFT

    @property
    def simulated(self) -> bool:
        return self.simulate_accept_len is not None or self.simulate_accept_rates is not None

    @property
    def tokens_per_decode(self) -> int:
        """KV entries one decode iteration may touch past seq_len: the verify window / extend;
        with zb_draft_preexec also the next round's draft, past the S+1 entries the step
        may commit (a draft with KV of its own reads S-1 entries of it beyond those)."""
        if not self.speculative:
            return 1
        n = max(self.num_draft_tokens, self.num_steps + 1)
        if self.zb_draft_preexec:
            own = self.num_steps - 1 if DRAFT_KINDS[self.draft].owns_kv else 0
            n = max(n, self.num_steps + 1 + own)
        return n

    @property
    def alloc_len_per_decode(self) -> int:
        from .mem.sizing import alloc_len_per_decode
        return alloc_len_per_decode(speculative=self.speculative, num_steps=self.num_steps,
                                    topk=self.topk, num_draft_tokens=self.num_draft_tokens,
                                    page_size=self.page_size,
                                    draft_owns_kv=self.speculative
                                    and DRAFT_KINDS[self.draft].owns_kv)

    @property
    def reserve_per_decode(self) -> int:
        from .mem.sizing import reserve_per_decode
        return reserve_per_decode(self.alloc_len_per_decode, self.page_size)

    @property
    def row_width(self) -> int:
        from .mem.sizing import row_width
        return row_width(self.context_len or 0, self.alloc_len_per_decode,
                         self.num_draft_tokens or 1, self.page_size)

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, self.dtype)

    # -- manifest ----------------------------------------------------------------------
    def manifest(self) -> dict:
        """The resolved settings in force plus versions, device and git commit."""
        import torch

        from .device import resolve_device
        from .version import __version__

        versions = {"mtplab": __version__, "torch": torch.__version__,
                    "python": platform.python_version()}
        try:                             # the installed version, without importing it
            versions["triton"] = metadata.version("triton")
        except metadata.PackageNotFoundError:
            versions["triton"] = None
        return {
            "config": asdict(self),
            "derived": {"alloc_len_per_decode": self.alloc_len_per_decode,
                        "reserve_per_decode": self.reserve_per_decode,
                        "row_width": self.row_width},
            "versions": versions,
            "device_name": resolve_device(self.device).name,
            "git_commit": git_commit(),
            "host": platform.node(),
            "argv": sys.argv,
            "created_unix": time.time(),
        }

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
