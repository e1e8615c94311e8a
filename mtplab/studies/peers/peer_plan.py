"""The grid of `python -m benchmarks.bench_peer_sglang` (mtplab and SGLang side by side): its
cells, the knobs each engine gets, the prompts and the model directories. The harness
(side_by_side.py) and its workers (peer_worker.py) both read it, so both engines are
configured from one place:

    cell  = (shape, draft, overlap, bs)     one row of the table
    group = (shape, draft, overlap)         one engine start per side serves every bs of it:
            + the bs of its cells           max_running_requests = cuda_graph_max_bs = the
                                            group's largest bs; a smaller bs is driven by
                                            submitting exactly bs requests at once (the batch
                                            is bs from the first step to the last, and both
                                            engines replay their graph bucket of that size:
                                            1, 8 and 32 are buckets in both)

    RunConfig knobs of a group (`group_knobs`)  ->  mtplab: RunConfig(**knobs, CUDA graphs,
                                                     triton attention, bf16)
                                                ->  SGLang: args.server_launch(RunConfig(knobs),
                                                     ServerSpec(CUDA graphs, triton, dummy
                                                     weights)) + SGLANG_ARGS + the graph
                                                     sizes (sglang_graph_args), parsed by SGLang's
                                                     own prepare_server_args in the worker

Model directories (config only; both engines draw random weights of the same config), by
the shape's attention layers:

    <models>/<shape>/llama/target, draft    full attention in every layer: a Llama target of
                                            the preset and an EAGLE draft at its width
                                            (target-only and EAGLE cells)
    <models>/<shape>/gemma4/target,         Gemma's sliding/full pattern: a Gemma-4 text
                            assistant       target mirroring the preset (layer types, window,
                                            heads, sizes) and a Frozen-KV assistant mirroring
                                            mtplab's (target-only and Frozen-KV cells;
                                            models.write_gemma4_frozen_dirs)

A (shape, draft) pair SGLang 0.5.17 cannot run like for like is left out of the grid, with
its reason (`pair_problem`): SGLang runs FROZEN_KV_MTP only with a Gemma-4 assistant over a
Gemma-4 target, whose KV it sizes as hybrid sliding-window (at least one sliding layer), so
Frozen-KV cells need a shape with Gemma's pattern; its EAGLE runs over the Llama target,
which has no sliding layers, so EAGLE cells need a full-attention shape.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from mtplab.config import RunConfig
from mtplab.draft_kinds import DRAFT_KINDS
from mtplab.sglang.args import FROZEN, ServerLaunch, ServerSpec, server_launch
from mtplab.sglang.models import frozen_assistant, sglang_gemma4_problem

# the Frozen-KV cells run on the Gemma-pattern shape, the EAGLE cells on the others
SHAPES = ("random-medium", "llama3-8b-like@8", "llama3-8b-like@32", "gemma4-31b-like@6")
BATCH_SIZES = (1, 8, 32)
# draft arm -> its RunConfig knobs (topk 4 arms: 8 draft tokens, page 16)
DRAFTS: dict[str, dict] = {
    "target": {"draft": "none"},
    "eagle": {"draft": "eagle", "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
    "frozen": {"draft": "frozen_kv_mtp", "num_steps": 3, "topk": 1, "num_draft_tokens": 4,
               "fold_seed": True},
    "eagle-k4p16": {"draft": "eagle", "num_steps": 3, "topk": 4, "num_draft_tokens": 8,
                    "page_size": 16},
    "frozen-k4p16": {"draft": "frozen_kv_mtp", "num_steps": 3, "topk": 4, "num_draft_tokens": 8,
                     "page_size": 16, "fold_seed": True},
}
OVERLAP = {"on": True, "off": False}
VOCAB_FLOOR = 10                  # prompt ids are drawn from [VOCAB_FLOOR, vocab)
# SGLang flags beyond the adapter's mapping, for both sides' like-for-like:
#   --disable-radix-cache    mtplab has no prefix cache: a repeated prompt must prefill again
#   --sampling-backend pytorch, --grammar-backend none: greedy, no grammar (and what the
#                            trimmed payload of scripts/sglang_h100.sh carries)
SGLANG_ARGS = ("--disable-radix-cache", "--sampling-backend", "pytorch", "--grammar-backend",
               "none", "--log-level", "warning")


@dataclass(frozen=True)
class Workload:
    """What every cell runs: bs prompts of prompt_len random token ids, all submitted at once,
    new_tokens each with ignore_eos; simulated acceptance of mean accept_len (spec cells)."""
    prompt_len: int = 256
    new_tokens: int = 128
    accept_len: float = 2.5
    repeats: int = 3
    warmup_tokens: int = 32
    profile_steps: int = 20
    seed: int = 0

    @property
    def context_len(self) -> int:
        """mtplab's context_len: the prompt, the output and one verify's overshoot."""
        return self.prompt_len + self.new_tokens + 64


@dataclass(frozen=True)
class Cell:
    shape: str
    draft: str
    overlap: str              # "on" | "off"
    bs: int

    @property
    def cell_id(self) -> str:
        return f"{self.shape}|{self.draft}|overlap-{self.overlap}|bs{self.bs}"

    @property
    def group(self) -> tuple:
        return (self.shape, self.draft, self.overlap)


@dataclass(frozen=True)
class Group:
    shape: str
    draft: str
    overlap: str
    bs: tuple                 # the bs of its cells, in the order they run

    @property
    def max_bs(self) -> int:
        return max(self.bs)

    @property
    def name(self) -> str:
        return f"{self.shape}_{self.draft}_overlap-{self.overlap}".replace("@", "-")

    def cells(self) -> list[Cell]:
        return [Cell(self.shape, self.draft, self.overlap, b) for b in self.bs]


def model_config(shape: str):
    """mtplab's LlamaConfig of a shape (the model zoo, imported on call: it imports torch)."""
    from mtplab.models.zoo import model_config as config_of
    return config_of(shape)


def plan(shapes, drafts, overlaps, batch_sizes, pairs=None) -> list[Group]:
    """Groups in the order given: the (shape, draft) pairs of shapes x drafts (shape, then
    draft), or `pairs` in their own order when given, each with every overlap; the pairs
    `left_out` names left out. ValueError naming the choices for an unknown entry (a shape
    is any mtplab preset, `<preset>@<layers>` too), or the reasons when no pair is left."""
    pairs = grid_pairs(shapes, drafts, pairs)
    for what, got, choices in (("draft", [d for _, d in pairs], DRAFTS),
                               ("overlap", overlaps, OVERLAP)):
        bad = [x for x in got if x not in choices]
        if bad:
            raise ValueError(f"unknown {what} {bad[0]!r}: use one of {list(choices)}.")
    for s in dict.fromkeys(s for s, _ in pairs):
        model_config(s)             # ValueError naming the presets
    if any(b < 1 for b in batch_sizes):
        raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}.")
    bs = tuple(dict.fromkeys(batch_sizes))
    keep = [(s, d) for s, d in pairs if pair_problem(s, d) is None]
    if not keep:
        raise ValueError("no cell of this grid runs like for like in SGLang 0.5.17: "
                         + "; ".join(f"{s}|{d}: {why}" for s, d, why in left_out(pairs=pairs)))
    return [Group(s, d, o, bs) for s, d in keep for o in dict.fromkeys(overlaps)]


def grid_pairs(shapes=(), drafts=(), pairs=None) -> list[tuple[str, str]]:
    """The (shape, draft) pairs of a grid: `pairs` as given (repeats dropped), else every
    shape with every draft."""
    if pairs is not None:
        return list(dict.fromkeys(tuple(p) for p in pairs))
    return [(s, d) for s in dict.fromkeys(shapes) for d in dict.fromkeys(drafts)]


def pair_problem(shape: str, draft: str) -> Optional[str]:
    """Why SGLang 0.5.17 cannot run `draft` on `shape` like for like (module docstring), or
    None: a Frozen-KV draft, or target-only on a sliding-window shape, runs the Gemma-4
    directories (models.sglang_gemma4_problem says what they cannot mirror); EAGLE the Llama
    ones, which have no sliding-window layers."""
    c = model_config(shape)
    if frozen(draft):
        return sglang_gemma4_problem(c, frozen_assistant(c, DRAFTS[draft]["draft"]).kv_layers)
    if c.has_sliding and not speculative(draft):
        return sglang_gemma4_problem(c)
    if c.has_sliding:
        return ("the shape has sliding-window layers and SGLang's EAGLE runs over a Llama "
                "target, which has none; use a full-attention shape (e.g. llama3-8b-like@8)")
    return None


def left_out(shapes=(), drafts=(), pairs=None) -> list[tuple[str, str, str]]:
    """(shape, draft, reason) of every pair `plan` leaves out, in the grid's order."""
    return [(s, d, why) for s, d in grid_pairs(shapes, drafts, pairs)
            if (why := pair_problem(s, d)) is not None]


def speculative(draft: str) -> bool:
    return DRAFTS[draft]["draft"] != "none"


def frozen(draft: str) -> bool:
    kind = DRAFTS[draft]["draft"]
    return kind in DRAFT_KINDS and DRAFT_KINDS[kind].sglang_algorithm == FROZEN


def group_knobs(g: Group, wl: Workload) -> dict:
    """The RunConfig knobs both engines share (the SGLang side maps them with args.py)."""
    k = {"model": g.shape, "page_size": 1, "max_running_requests": g.max_bs,
         "cuda_graph_max_bs": g.max_bs, "overlap": OVERLAP[g.overlap], "seed": wl.seed,
         "context_len": wl.context_len, **DRAFTS[g.draft]}
    if speculative(g.draft):
        k["simulate_accept_len"] = wl.accept_len
    return k


def mtplab_knobs(g: Group, wl: Workload) -> dict:
    """mtplab's RunConfig: the shared knobs on CUDA with graphs, triton attention, bf16 (the
    model directories' dtype), no meter, no profiler (the timed engine)."""
    return {**group_knobs(g, wl), "device": "cuda", "cuda_graphs": True,
            "attention_backend": "triton", "dtype": "bfloat16"}


def gemma4_shape(shape: str) -> bool:
    """A shape whose SGLang side runs the Gemma-4 directories (it has sliding layers)."""
    return model_config(shape).has_sliding


def model_dirs(models: Path, shape: str, draft: str) -> tuple[Path, Optional[Path]]:
    """(target, draft or None) of a cell's SGLang side (module docstring)."""
    root = Path(models) / shape.replace("@", "-")
    kind, sub = ("gemma4", "assistant") if gemma4_shape(shape) else ("llama", "draft")
    return root / kind / "target", (root / kind / sub if speculative(draft) else None)


def sglang_graph_args(g: Group, wl: Workload) -> tuple:
    """SGLang's CUDA-graph sizes: exactly those the group's workload runs, its decode graphs
    (verify, draft, draft extend) at the group's bs and its prefill graphs (target and draft)
    at bs * prompt_len tokens. Each step replays the graph of the size it would under SGLang's
    default lists (every bs up to the largest; 58 token counts up to 8192 on the H100, among
    them 256, 2048 and 8192), whose prefill captures alone take about 15 s per model."""
    bs = sorted(g.bs)
    return ("--cuda-graph-bs-decode", *map(str, bs),
            "--cuda-graph-bs-prefill", *(str(b * wl.prompt_len) for b in bs))


def sglang_launch(g: Group, wl: Workload, models: Path, mem_fraction: float) -> ServerLaunch:
    """SGLang's arguments and environment for a group, from the same knobs as mtplab's
    (ConfigError for knobs SGLang lacks: args.refuse_unsupported)."""
    target, draft = model_dirs(models, g.shape, g.draft)
    cfg = RunConfig(**group_knobs(g, wl), device="cpu")     # mapping only: resolved on no GPU
    spec = ServerSpec(model_path=str(target),
                      draft_model_path=None if draft is None else str(draft),
                      device="cuda", attention_backend="triton", dummy_weights=True,
                      cuda_graphs=True, mem_fraction_static=mem_fraction,
                      extra_args=SGLANG_ARGS + sglang_graph_args(g, wl))
    return server_launch(cfg, spec)


def write_model_dirs(models: Path, groups: list[Group]) -> None:
    """The config-only directories the groups need (module docstring)."""
    from mtplab.sglang.models import write_gemma4_frozen_dirs, write_llama_eagle_dirs

    done = set()
    for g in groups:
        target, _ = model_dirs(models, g.shape, g.draft)
        if target in done:
            continue
        done.add(target)
        if gemma4_shape(g.shape):
            write_gemma4_frozen_dirs(target.parent, model=g.shape)
        else:
            write_llama_eagle_dirs(target.parent, g.shape)


def vocab_size(models: Path, shape: str, draft: str) -> int:
    """The target's vocabulary, read from the directory SGLang loads."""
    target, _ = model_dirs(models, shape, draft)
    doc = json.loads((target / "config.json").read_text())
    return int(doc.get("vocab_size") or doc["text_config"]["vocab_size"])


def prompts(cell: Cell, repeat: int, wl: Workload, vocab: int) -> list[list[int]]:
    """bs prompts of wl.prompt_len token ids in [VOCAB_FLOOR, vocab): the same for both engines
    and for every draft and overlap arm of a (shape, bs), fresh for every repeat (seeded by
    shape, bs, repeat and wl.seed; warm-up is repeat -1)."""
    seed = zlib.crc32(f"{cell.shape}|bs{cell.bs}|{repeat}|{wl.seed}".encode())
    rng = np.random.default_rng(seed)
    return rng.integers(VOCAB_FLOOR, vocab, size=(cell.bs, wl.prompt_len)).tolist()
