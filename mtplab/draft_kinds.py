"""The draft kinds: one table that config validation, the engine, the memory estimate, the HBM
floor, the CLI and the SGLang adapter read (`RunConfig.draft` is a key of it, or "none").

    row (DraftSpec)    what it says                                 who reads it
    name               the RunConfig.draft value                    config, CLI choices, sglang
    help               one line for --help and the knobs table      config (knob help)
    owns_kv            the draft writes a KV pool of its own        sizing, memory, floor
                       (one layer, the target's slot ids)
    seed_forward       seed() runs a forward (fold_seed can put     config (fold_seed), sglang
                       it inside the draft graph)
    extend_forward     extend() runs a forward of its own (the      engine (future map), worker
                       draft_extend stage and its graph)
    sglang_algorithm   SGLang's --speculative-algorithm             sglang adapter
    sglang_token_map   SGLang's worker for it takes                 sglang adapter
                       --speculative-token-map (a hot vocabulary)
    min_target_layers  the fewest target layers it can ride on      config
    weights            the folder a trained preset ships it in      config, zoo
                       (<preset>/<weights>/model.safetensors)
    module             the kind's module, imported when a draft     engine, memory, zoo
                       is built or counted: `Worker` (a DraftWorker,
                       speculative/draft_worker.py), `build(target, seed) -> draft model`
                       (only the chosen kind is built), `param_count(target_config) -> int`,
                       for a kind without KV of its own `assistant_config(target_config)`
                       (its AssistantConfig: width, layers, the target layers they read)

This module is a leaf and imports no torch: the CLI, the SGLang adapter and config validation
read the table without building anything. A kind's module lives in mtplab/speculative/ and
imports what it needs; adding a draft kind is that one module and one row below.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class DraftSpec:
    name: str
    help: str
    owns_kv: bool
    seed_forward: bool
    extend_forward: bool
    sglang_algorithm: str
    sglang_token_map: bool
    module: str
    weights: str                # a trained preset ships this kind in <preset>/<weights>/
    min_target_layers: int = 1

    def _module(self):
        return importlib.import_module(self.module)

    @property
    def worker(self):
        """The DraftWorker class of this kind (its `create` puts the model on the device)."""
        return self._module().Worker

    def build(self, target, seed: int = 0):
        """The draft model for `target`: shipped weights for a trained preset, else seeded
        random init where the target was built (models/zoo.py `build_draft`)."""
        return self._module().build(target, seed)

    def param_count(self, target_config) -> int:
        """Parameters the draft owns (not the target's embedding or LM head it reads)."""
        return self._module().param_count(target_config)

    def assistant_config(self, target_config):
        """The AssistantConfig a Frozen-KV kind builds for a target config (random init)."""
        return self._module().assistant_config(target_config)


DRAFT_KINDS: dict[str, DraftSpec] = {s.name: s for s in (
    DraftSpec("frozen_kv_mtp", "assistant reading the target's KV (no KV of its own)",
              owns_kv=False, seed_forward=True, extend_forward=False,
              sglang_algorithm="FROZEN_KV_MTP", sglang_token_map=False,
              module="mtplab.speculative.draft_frozen", weights="assistant"),
    DraftSpec("eagle", "one-layer draft with its own KV, rewritten by draft_extend",
              owns_kv=True, seed_forward=False, extend_forward=True,
              sglang_algorithm="EAGLE", sglang_token_map=True,
              module="mtplab.speculative.draft_eagle", weights="eagle"),
    DraftSpec("gemma4_assistant", "Gemma-4's 4-layer Frozen-KV assistant (layers n-2 / n-1, "
              "own tied head)", owns_kv=False, seed_forward=True, extend_forward=False,
              sglang_algorithm="FROZEN_KV_MTP", sglang_token_map=False,
              module="mtplab.speculative.draft_gemma4", weights="gemma4_assistant",
              min_target_layers=2),
)}

NO_DRAFT = "none"
DRAFT_CHOICES = (NO_DRAFT, *DRAFT_KINDS)


def draft_kind(name: str) -> DraftSpec:
    """The row of `name`; ValueError naming the choices for anything else ("none" included:
    it has no row)."""
    try:
        return DRAFT_KINDS[name]
    except KeyError:
        raise ValueError(f"unknown draft {name!r}: use one of {list(DRAFT_KINDS)}.") from None


def kinds_where(**flags) -> list[str]:
    """Names of the kinds whose fields equal `flags` (e.g. seed_forward=True), in table order:
    error messages name the drafts a setting works with from here."""
    return [n for n, s in DRAFT_KINDS.items()
            if all(getattr(s, k) == v for k, v in flags.items())]


@dataclass(frozen=True)
class DraftVocab:
    """`RunConfig.draft_vocab`, parsed: the vocabulary a draft's LM head scores.

    full               every token (the head as trained)
    hot:<N>            the N most frequent tokens of the model's corpus (FR-Spec): a head of
                       N rows; a token outside them is never drafted
    centroids:<C>/<k>  tokens in C equal clusters; per row the k best clusters' tokens are
                       scored (Gemma-4 E2B/E4B's masked head): C + k V / C rows
    """
    kind: str               # "full" | "hot" | "centroids"
    size: int = 0           # hot: N
    clusters: int = 0       # centroids: C
    top: int = 0            # centroids: k


def parse_draft_vocab(text: str) -> DraftVocab:
    """ValueError naming the three forms for anything else."""
    kind, _, arg = str(text).partition(":")
    try:
        if kind == "full" and not arg:
            return DraftVocab("full")
        if kind == "hot":
            n = int(arg)
            if n >= 1:
                return DraftVocab("hot", size=n)
        if kind == "centroids":
            c, _, k = arg.partition("/")
            c, k = int(c), int(k)
            if c >= 1 and k >= 1:
                return DraftVocab("centroids", clusters=c, top=k)
    except ValueError:
        pass
    raise ValueError(f"draft_vocab={text!r} is not 'full', 'hot:<N>' or "
                     "'centroids:<C>/<k>' with positive integers (e.g. hot:4096, "
                     "centroids:2048/32)")
