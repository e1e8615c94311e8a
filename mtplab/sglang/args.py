"""RunConfig -> `python -m sglang.launch_server` arguments and environment, keyed by version.

    RunConfig knob                 SGLang (>= 0.5.17)                         (< 0.5.17)
    draft (a draft kind)           --speculative-algorithm: the kind's           (same)
                                   sglang_algorithm (draft_kinds.py)
    num_steps, topk, D             --speculative-num-steps / -eagle-topk / -num-draft-tokens
    page_size                      --page-size
    max_running_requests           --max-running-requests
    overlap=False                  --disable-overlap-schedule
    cuda_graphs=True, max bs N     --cuda-graph-max-bs-decode N              --cuda-graph-max-bs N
    cuda_graphs=False              --cuda-graph-backend-{decode,prefill}     --disable-cuda-graph
                                   disabled
    simulate_accept_len m          env SGLANG_SIMULATE_ACC_LEN=m, _METHOD=match-expected
    seed                           --random-seed
    (ServerSpec) device, backend   --device, --attention-backend: always explicit
    (always)                       --skip-tokenizer-init: the driver sends token ids
    (ServerSpec) deterministic     --enable-deterministic-inference
    (ServerSpec) dtype             --dtype (not passed for None / auto: the model's)
    (ServerSpec) context_len       --context-length
    (ServerSpec) max_total_tokens  --max-total-tokens
    (ServerSpec) dummy weights     --load-format dummy --speculative-draft-load-format dummy
    (ServerSpec) cuda_graphs       overrides cfg.cuda_graphs (RunConfig resolves for this host)
    draft_vocab hot:<N>            --speculative-token-map FILE (ServerSpec.token_map: the hot
                                   ids, models.write_token_map), where the kind's SGLang worker
                                   takes one (draft_kinds.py sglang_token_map: EAGLE in 0.5.17)

Knobs SGLang has no equivalent for (spec_schedule, zero_bubble, draft_kv_window, ...) are
refused (ConfigError, one sentence), and so are the FROZEN_KV_MTP combinations SGLang's own
argument checks let through but its worker cannot run. `check_model_dirs` checks the model
directories before anything starts: a target and a draft holding config.json, the draft of a
FROZEN_KV_MTP kind a Frozen-KV assistant (the architectures SGLang's Frozen-KV worker runs) and
the draft of any other kind not one (SGLang would run it as FROZEN_KV_MTP).
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..config import RunConfig
from ..draft_kinds import DRAFT_KINDS, kinds_where, parse_draft_vocab
from ..errors import ConfigError
from ..zero_bubble import ZB_SUBKNOBS

ALGORITHMS = {name: kind.sglang_algorithm for name, kind in DRAFT_KINDS.items()}
FROZEN = "FROZEN_KV_MTP"           # SGLang's Frozen-KV worker (frozen_kv_mtp_worker_v2.py)
# the zero-bubble sub-knobs SGLang always runs (what it does); it has none of the others
SGLANG_ZB = {"zb_async_d2h": "copies results back asynchronously"}
# SGLang's allow-list for topk > 1 with page > 1 (_handle_eagle_family), which it skips for
# FROZEN_KV_MTP; and the Frozen-KV draft backends for topk > 1 (_init_draft_attn_backend).
PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")
FROZEN_TOPK_BACKENDS = ("triton", "trtllm_mha")
DECODE_FLAG_RENAME = (0, 5, 17)   # first version with --cuda-graph-max-bs-decode
# SGLang 0.5.17's --device and --attention-backend choices (server_args.py); anything else
# would only fail inside the server, after its start-up.
DEVICES = ("cuda", "xpu", "hpu", "npu", "cpu", "musa", "mps")
ATTENTION_BACKENDS = ("triton", "torch_native", "flex_attention", "dsa", "nsa", "dsv4",
                      "compressed", "cutlass_mla", "fa3", "fa4", "flashinfer", "flashmla",
                      "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "trtllm_mha",
                      "dual_chunk_flash_attn", "hpc_ops", "aiter", "wave", "intel_amx", "ascend",
                      "intel_xpu")
# Server flags the adapter owns whether or not this launch sets them (the server's identity,
# the speculation and the loop); with every flag a launch does set, --extra-args may not
# repeat them (SGLang's argparse keeps the last: the run would not be what mtplab reports).
OWNED_FLAGS = ("--model-path", "--host", "--port", "--speculative-algorithm",
               "--speculative-draft-model-path", "--speculative-num-steps",
               "--speculative-eagle-topk", "--speculative-num-draft-tokens",
               "--speculative-token-map", "--disable-overlap-schedule")
# Draft architectures SGLang's Frozen-KV worker runs (models/gemma4_mtp.py's EntryClass).
FROZEN_ASSISTANTS = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")


def parse_version(v: str) -> tuple:
    try:
        return tuple(int(x) for x in v.split(".")[:3])
    except ValueError:
        raise ConfigError(f"sglang version {v!r} is not of the form X.Y.Z, e.g. 0.5.17.") from None


@dataclass(frozen=True)
class ServerSpec:
    """What RunConfig does not say: where the model is and how the server runs."""
    model_path: str
    draft_model_path: Optional[str] = None
    version: str = "0.5.17"
    device: str = "cuda"
    attention_backend: str = "triton"
    host: str = "127.0.0.1"
    port: int = 30000
    dummy_weights: bool = False
    deterministic: bool = False
    mem_fraction_static: Optional[float] = None
    dtype: Optional[str] = None
    context_len: Optional[int] = None
    max_total_tokens: Optional[int] = None
    # CUDA graphs on the server; None -> cfg.cuda_graphs (RunConfig resolves graphs for the
    # local device, which may be a CPU that cannot say True).
    cuda_graphs: Optional[bool] = None
    extra_args: tuple = ()
    token_map: Optional[str] = None       # hot token ids (torch.save of a list), for hot:<N>


@dataclass(frozen=True)
class ServerLaunch:
    argv: tuple                     # arguments after `python -m sglang.launch_server`
    env: dict = field(default_factory=dict)

    def command(self, python: str = "python") -> list:
        return [python, "-m", "sglang.launch_server", *self.argv]

    def shell_line(self, python: str = "python") -> str:
        """One line a shell runs as is: env assignments, then the quoted command."""
        envs = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join(envs + [shlex.join(self.command(python))])

    def key(self) -> tuple:
        """Cells with equal keys can share one server."""
        return (self.argv, tuple(sorted(self.env.items())))


def _frozen(cfg: RunConfig) -> bool:
    """The draft runs on SGLang's Frozen-KV worker."""
    return ALGORITHMS.get(cfg.draft) == FROZEN


def refuse_unsupported(cfg: RunConfig, spec: ServerSpec) -> None:
    """ConfigError for knobs SGLang lacks and for Frozen-KV settings its worker cannot run."""
    if _frozen(cfg) and not cfg.fold_seed:
        raise ConfigError("SGLang's Frozen-KV worker always runs the seed step inside its draft "
                          "graph; set fold_seed=True to compare like with like.")
    if cfg.zero_bubble:
        raise ConfigError("SGLang has no zero_bubble mode; set zero_bubble=False for an SGLang "
                          "run.")
    if cfg.spec_schedule is not None:
        raise ConfigError("SGLang 0.5.17 takes no per-batch-size speculation schedule; leave "
                          "spec_schedule unset for an SGLang run.")
    for name in ZB_SUBKNOBS:           # SGLang runs each at what SGLANG_ZB says, or off
        if getattr(cfg, name, None) is False and SGLANG_ZB.get(name):
            raise ConfigError(f"SGLang always {SGLANG_ZB[name]}; leave {name} at its default "
                              "for an SGLang run.")
        if getattr(cfg, name, None) and name not in SGLANG_ZB:
            raise ConfigError(f"SGLang has no {name} mode; set {name}=False for an SGLang run.")
    if cfg.draft_kv_window:
        raise ConfigError("SGLang's draft attends the whole context; leave draft_kv_window=0 "
                          "for an SGLang run.")
    if cfg.simulate_accept_rates is not None:
        raise ConfigError("SGLang simulates only a mean accept length (SGLANG_SIMULATE_ACC_LEN);"
                          " use simulate_accept_len instead of simulate_accept_rates.")
    if cfg.speculative and spec.draft_model_path is None:
        raise ConfigError(f"draft={cfg.draft!r} needs a draft model directory; pass "
                          "draft_model_path.")
    if not cfg.speculative and spec.draft_model_path is not None:
        raise ConfigError("draft_model_path is given but draft='none' runs no draft; set "
                          f"draft to one of {list(DRAFT_KINDS)}, or leave draft_model_path out.")
    _refuse_draft_vocab(cfg, spec)
    if spec.device not in DEVICES:
        raise ConfigError(f"SGLang has no device {spec.device!r}; use one of {list(DEVICES)}.")
    if spec.attention_backend not in ATTENTION_BACKENDS:
        raise ConfigError(f"SGLang has no attention backend {spec.attention_backend!r}; use one "
                          f"of {list(ATTENTION_BACKENDS)}.")
    if _frozen(cfg) and cfg.topk > 1:
        if spec.attention_backend not in FROZEN_TOPK_BACKENDS:
            raise ConfigError(f"SGLang's Frozen-KV draft with topk={cfg.topk} runs only on "
                              f"{FROZEN_TOPK_BACKENDS}; set the attention backend to triton.")
        if cfg.page_size > 1 and spec.attention_backend not in PAGE_TREE_BACKENDS:
            raise ConfigError(f"topk>1 with page_size>1 needs one of {PAGE_TREE_BACKENDS}; "
                              "set the attention backend to triton.")


def _refuse_draft_vocab(cfg: RunConfig, spec: ServerSpec) -> None:
    dv = parse_draft_vocab(cfg.draft_vocab)
    if dv.kind == "centroids":
        raise ConfigError("SGLang takes a centroid head from the assistant's config.json "
                          "(use_ordered_embeddings, num_centroids, centroid_intermediate_top_k), "
                          "not from a flag; use draft_vocab='full' with such an assistant.")
    if dv.kind == "hot":
        if not DRAFT_KINDS[cfg.draft].sglang_token_map:
            raise ConfigError(f"SGLang's {ALGORITHMS[cfg.draft]} worker takes no "
                              "--speculative-token-map; use draft_vocab='full' for an SGLang "
                              f"run of {cfg.draft}, or a draft of "
                              f"{kinds_where(sglang_token_map=True)}.")
        if spec.token_map is None:
            raise ConfigError(f"draft_vocab={cfg.draft_vocab!r} on SGLang needs the hot ids as "
                              "a file: pass token_map (mtplab.sglang.models.write_token_map).")


def _architectures(path: str, what: str) -> list:
    """The `architectures` of the model directory `path` (ConfigError unless it is one)."""
    cfg = Path(path) / "config.json"
    if not Path(path).is_dir():
        raise ConfigError(f"{what} {path} is not a directory; pass a local model directory "
                          "(config.json and weights, or config only with dummy weights).")
    try:
        doc = json.loads(cfg.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what} {path} has no readable config.json ({e}); pass a model "
                          "directory.") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{what} {path}: config.json is not a JSON object; pass a model "
                          "directory.")
    archs = doc.get("architectures") or []
    return archs if isinstance(archs, list) else [archs]


def check_model_dirs(cfg: RunConfig, spec: ServerSpec) -> None:
    """The target and draft directories and the token map file, before a server starts (see
    the module docstring)."""
    if spec.token_map is not None and not Path(spec.token_map).is_file():
        raise ConfigError(f"token_map {spec.token_map} is not a file; write one with "
                          "mtplab.sglang.models.write_token_map and pass its path.")
    _architectures(spec.model_path, "model_path")
    if not cfg.speculative or spec.draft_model_path is None:
        return
    archs = _architectures(spec.draft_model_path, "draft_model_path")
    frozen = any(a in FROZEN_ASSISTANTS for a in archs)
    if _frozen(cfg) and not frozen:
        raise ConfigError(f"draft_model_path {spec.draft_model_path} is not a Frozen-KV "
                          f"assistant (architectures {archs}, SGLang's Frozen-KV worker runs "
                          f"{list(FROZEN_ASSISTANTS)}); pass an assistant directory.")
    if not _frozen(cfg) and frozen:
        raise ConfigError(f"draft_model_path {spec.draft_model_path} is a Frozen-KV assistant "
                          f"({archs}), which SGLang runs as FROZEN_KV_MTP; use a draft of "
                          f"{kinds_where(sglang_algorithm=FROZEN)} or a {cfg.draft} draft "
                          "directory.")


def server_launch(cfg: RunConfig, spec: ServerSpec) -> ServerLaunch:
    refuse_unsupported(cfg, spec)
    ver = parse_version(spec.version)
    a = ["--model-path", spec.model_path, "--device", spec.device,
         "--attention-backend", spec.attention_backend, "--host", spec.host,
         "--port", str(spec.port), "--page-size", str(cfg.page_size),
         "--max-running-requests", str(cfg.max_running_requests),
         "--random-seed", str(cfg.seed), "--skip-tokenizer-init"]
    env = {}
    if cfg.speculative:
        a += ["--speculative-algorithm", ALGORITHMS[cfg.draft],
              "--speculative-draft-model-path", spec.draft_model_path,
              "--speculative-num-steps", str(cfg.num_steps),
              "--speculative-eagle-topk", str(cfg.topk),
              "--speculative-num-draft-tokens", str(cfg.num_draft_tokens)]
        if spec.token_map is not None:
            a += ["--speculative-token-map", spec.token_map]
        if cfg.simulate_accept_len is not None:
            env["SGLANG_SIMULATE_ACC_LEN"] = repr(float(cfg.simulate_accept_len))
            env["SGLANG_SIMULATE_ACC_METHOD"] = "match-expected"
    if not cfg.overlap:
        a.append("--disable-overlap-schedule")
    new = ver >= DECODE_FLAG_RENAME
    graphs = cfg.cuda_graphs if spec.cuda_graphs is None else spec.cuda_graphs
    if graphs:
        a += ["--cuda-graph-max-bs-decode" if new else "--cuda-graph-max-bs",
              str(cfg.cuda_graph_max_bs)]
    elif new:
        a += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    else:
        a.append("--disable-cuda-graph")
    if spec.dummy_weights:
        a += ["--load-format", "dummy"]
        if cfg.speculative:
            a += ["--speculative-draft-load-format", "dummy"]
    if spec.deterministic:
        a.append("--enable-deterministic-inference")
    if spec.mem_fraction_static is not None:
        a += ["--mem-fraction-static", str(spec.mem_fraction_static)]
    if spec.dtype not in (None, "auto"):
        a += ["--dtype", spec.dtype]
    if spec.context_len is not None:
        a += ["--context-length", str(spec.context_len)]
    if spec.max_total_tokens is not None:
        a += ["--max-total-tokens", str(spec.max_total_tokens)]
    _refuse_owned(spec.extra_args, {w for w in a if w.startswith("--")} | set(OWNED_FLAGS))
    a += list(spec.extra_args)
    return ServerLaunch(argv=tuple(a), env=env)


def _refuse_owned(extra: tuple, owned: set) -> None:
    """ConfigError when extra_args sets a flag the adapter sets (or owns): `--port 1` and
    `--port=1` alike."""
    for word in extra:
        flag = word.split("=", 1)[0]
        if flag in owned:
            raise ConfigError(f"extra_args sets {flag}, which the adapter sets itself from "
                              "mtplab's own flags (--model, --port, --draft-model, the RunConfig "
                              "knobs); set it there, not in extra_args.")
