"""Train the `tiny-code` zoo entry: a byte-level Llama target on the CPython standard library,
then its Frozen-KV MTP assistant and EAGLE draft against the frozen target.

    python -m mtplab.models.train --out DIR [--target-seconds 300 --assistant-seconds 90 ...]

writes DIR/target/{config.json,model.safetensors} (HF LlamaForCausalLM), DIR/assistant/ and
DIR/eagle/ ({config.json,model.safetensors} each), DIR/tokenizer.json, DIR/token_counts.json
(the training split's token counts) and DIR/manifest.json.

Dense (no paged KV) training forwards over a batch of windows ids [B, T] at positions 0..T-1,
reusing the modules' parameters; they compute what the engine's paged path computes:
  target     x_{i+1} from x_{<=i}; hidden h_i = pre-final-norm residual (what drafts read)
  assistant  (Frozen-KV MTP, unrolled S steps at the constant anchor position p, attending the
             target's cached K/V of its kv_layers over [0, p] exactly as at draft time):
               step 0: (x_{p+1}, h_p)            -> a_0, predicts x_{p+2}
               step k: (x_{p+k+1}, a_{k-1})      -> a_k, predicts x_{p+k+2}
  eagle      (own KV) step 0 teacher-forced: row i = (x_{i+1}, h_i) at position i, causal over
             its own step-0 keys; step k >= 1 (training-time test): row i = (x_{i+1},
             g_{k-1, i-1}) at position i, attending step-0 keys j <= i-k and the step-m key at
             i-k+m (m = 1..k): the draft KV the engine holds after k draft steps from anchor i-k.
Draft labels are the frozen target's own distribution (soft distillation): for a prediction of
x_{j+1} the label is softmax(target logits at j). Drafts never change the target's parameters
(embedding and LM head are shared, frozen). Every stage stops on its wall-clock budget (or
--max-steps); the LR follows warmup + cosine over the fraction of budget spent.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..atomic import atomic_path, atomic_write_text
from ..provenance import git_commit
from .corpus import Corpus, load_corpus, token_counts
from .drafts import EagleDraft, FrozenKVAssistant
from .llama import LlamaForCausalLM
from .llama_config import LlamaConfig
from .tokenizer import BYTE0
from .weights import save_model
from .zoo import assistant_config


@dataclass
class TrainConfig:
    out: str
    # target shape (tiny-code)
    layers: int = 6
    hidden: int = 256
    ffn: int = 768
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 320
    max_positions: int = 1024
    # optimisation
    seq_len: int = 1024
    batch: int = 32
    target_lr: float = 2e-3
    draft_lr: float = 1.5e-3
    warmup_steps: int = 200
    weight_decay: float = 0.1
    draft_steps: int = 3                     # S: unrolled draft steps
    target_seconds: float = 300.0
    assistant_seconds: float = 90.0
    eagle_seconds: float = 90.0
    max_steps: Optional[int] = None          # per stage; None = wall-clock budget only
    eval_tokens: int = 1_000_000             # held-out tokens evaluated (whole windows)
    log_every: int = 50
    max_files: Optional[int] = None          # corpus slice (smoke tests)
    corpus_root: Optional[str] = None        # None = this Python's stdlib
    val_every: int = 500                     # target stage: held-out loss every N steps
    val_windows: int = 32                    # ... over this many held-out windows
    device: str = "auto"
    seed: int = 0
    save_dtype: str = "bfloat16"

    def target_config(self) -> LlamaConfig:
        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden,
                           intermediate_size=self.ffn, num_hidden_layers=self.layers,
                           num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                           head_dim=self.hidden // self.heads,
                           max_position_embeddings=self.max_positions, rope_theta=10000.0)


# -- dense training forwards ------------------------------------------------------------------

def _attend(q, k, v, *, causal: bool = False, mask: Optional[torch.Tensor] = None):
    """q [B,T,Hq,d], k/v [B,Tk,Hkv,d] (GQA: kv head j serves q heads j*g..j*g+g-1)."""
    g = q.shape[2] // k.shape[2]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return o.transpose(1, 2).flatten(2)


def target_forward(t: LlamaForCausalLM, ids: torch.Tensor, kv_layers=()):
    """-> (hidden [B,T,H] pre-final-norm, {layer: (k post-RoPE, v) [B,T,Hkv,d]})."""
    B, T = ids.shape
    pos = torch.arange(T, device=ids.device)
    x = t.model.embed_tokens(ids)
    kvs = {}
    for i, layer in enumerate(t.model.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = t.rope_of(i)(a.q_proj(h).view(B, T, a.nq, a.d), pos)
        k = t.rope_of(i)(a.k_proj(h).view(B, T, a.nkv, a.d), pos)
        v = a.v_proj(h).view(B, T, a.nkv, a.d)
        if i in kv_layers:
            kvs[i] = (k, v)
        x = x + a.o_proj(_attend(q, k, v, causal=True))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return x, kvs


def assistant_step(asst: FrozenKVAssistant, tokens, hidden, kvs):
    """One unrolled assistant step for every anchor p at once (query at p sees keys [0, p])."""
    t = asst.target
    B, T = tokens.shape
    pos = torch.arange(T, device=tokens.device)
    e = t.model.embed_tokens(tokens) * asst.embed_scale
    x = asst.pre_projection(torch.cat([e, hidden.to(e.dtype)], -1))
    for layer, li in zip(asst.layers, asst.acfg.kv_layers):
        a = layer.self_attn
        q = t.rope_of(li)(a.q_proj(layer.input_layernorm(x)).view(B, T, a.nq, a.d), pos)
        x = x + a.o_proj(_attend(q, *kvs[li], causal=True))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return asst.output(x)


def eagle_mask(T: int, k: int, device) -> torch.Tensor:
    """[T, (k+1)T] bool for unrolled step k: row i sees step-0 keys j <= i-k and, for m=1..k,
    the step-m key at i-k+m (m = k: itself)."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    blocks = [j <= i - k] + [j == i - k + m for m in range(1, k + 1)]
    return torch.cat(blocks, 1)


def eagle_unrolled(eagle: EagleDraft, tokens, hidden, steps: int):
    """Logits [steps, B, T, V]; row i of step k predicts x_{i+2} (valid for i >= k)."""
    t = eagle.target
    layer, a = eagle.layer, eagle.layer.self_attn
    rope = t.rope_of(t.config.num_hidden_layers - 1)
    B, T = tokens.shape
    pos = torch.arange(T, device=tokens.device)
    e = t.model.embed_tokens(tokens)
    keys, vals, outs = [], [], []
    h_in = hidden
    for k in range(steps):
        x = eagle.fc(torch.cat([e, h_in.to(e.dtype)], -1))
        hn = layer.input_layernorm(x)
        q = rope(a.q_proj(hn).view(B, T, a.nq, a.d), pos)
        keys.append(rope(a.k_proj(hn).view(B, T, a.nkv, a.d), pos))
        vals.append(a.v_proj(hn).view(B, T, a.nkv, a.d))
        if k == 0:
            o = _attend(q, keys[0], vals[0], causal=True)
        else:
            o = _attend(q, torch.cat(keys, 1), torch.cat(vals, 1),
                        mask=eagle_mask(T, k, tokens.device))
        x = x + a.o_proj(o)
        g = x + layer.mlp(layer.post_attention_layernorm(x))
        outs.append(t.lm_head(eagle.norm(g)).float())
        h_in = torch.cat([torch.zeros_like(g[:, :1]), g[:, :-1]], 1)     # g_{k, i-1}
    return torch.stack(outs)


# -- losses -----------------------------------------------------------------------------------

def shift_left(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """y[:, i] = x[:, i+n] (fill past the end)."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], 1)


def soft_ce(logits: torch.Tensor, teacher_logp: torch.Tensor, valid: torch.Tensor):
    """Mean over valid rows of -sum p_teacher log q, and top-1 agreement with the teacher."""
    logq = torch.log_softmax(logits.float(), -1)
    ce = -(teacher_logp.exp() * logq).sum(-1)
    agree = (logits.argmax(-1) == teacher_logp.argmax(-1)).float()
    valid = valid.expand_as(ce)
    n = valid.sum().clamp(min=1)
    return (ce * valid).sum() / n, (agree * valid).sum() / n


def target_loss(t: LlamaForCausalLM, ids):
    h, _ = target_forward(t, ids[:, :-1])
    logits = t.logits(h)
    tgt = ids[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                           reduction="none").view_as(tgt)
    is_byte = (tgt >= BYTE0).float()
    acc = (logits.argmax(-1) == tgt).float()
    n = is_byte.sum().clamp(min=1)
    return (loss * is_byte).sum() / n, {"acc": (acc * is_byte).sum() / n}


def teacher(t: LlamaForCausalLM, ids, kv_layers=()):
    with torch.no_grad():
        h, kvs = target_forward(t, ids, kv_layers)
        logp = torch.log_softmax(t.logits(h), -1)
    return h, kvs, logp


def assistant_loss(asst: FrozenKVAssistant, ids, steps: int):
    h, kvs, logp = teacher(asst.target, ids, set(asst.acfg.kv_layers))
    T = ids.shape[1]
    pos = torch.arange(T, device=ids.device)[None, :]
    total, metrics = 0.0, {}
    for k in range(steps):
        h, logits = assistant_step(asst, shift_left(ids, k + 1), h, kvs)
        valid = (pos <= T - 2 - k).float()
        ce, agree = soft_ce(logits, shift_left(logp, k + 1), valid)
        total = total + ce
        metrics[f"agree{k}"] = agree
    return total / steps, metrics


def eagle_loss(eagle: EagleDraft, ids, steps: int):
    h, _, logp = teacher(eagle.target, ids)
    T = ids.shape[1]
    pos = torch.arange(T, device=ids.device)[None, :]
    logits = eagle_unrolled(eagle, shift_left(ids, 1), h, steps)
    label = shift_left(logp, 1)
    total, metrics = 0.0, {}
    for k in range(steps):
        valid = ((pos >= k) & (pos <= T - 2)).float()
        ce, agree = soft_ce(logits[k], label, valid)
        total = total + ce
        metrics[f"agree{k}"] = agree
    return total / steps, metrics


# -- training loop ----------------------------------------------------------------------------

@dataclass
class StageResult:
    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0
    curve: list = field(default_factory=list)      # [step, seconds, loss, {metric: value}]
    val_curve: list = field(default_factory=list)  # [step, held-out loss]


def init_weights(model: torch.nn.Module, seed: int, num_layers: int) -> None:
    """GPT-style init on a CPU generator: N(0, 0.02), residual outputs N(0, 0.02/sqrt(2L)),
    norms 1. Deterministic for a given seed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            std = 0.02 / math.sqrt(2 * num_layers) if name.endswith(("o_proj.weight",
                                                                      "down_proj.weight")) \
                else 0.02
            p.copy_(torch.randn(p.shape, generator=g) * std)


def train_stage(name: str, params, loss_fn: Callable, sample: Callable, cfg: TrainConfig,
                lr: float, budget_s: float, dev: torch.device,
                validate: Optional[Callable[[], float]] = None) -> StageResult:
    """AdamW, warmup then cosine to lr/10 over max(step/max_steps, elapsed/budget);
    `validate` (held-out loss) runs every cfg.val_every steps and at the end."""
    params = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                            fused=dev.type == "cuda")
    res = StageResult()
    bar = tqdm(desc=name, unit="step", mininterval=5.0)
    t0 = time.perf_counter()
    while True:
        elapsed = time.perf_counter() - t0
        frac = elapsed / budget_s if budget_s > 0 else 1.0
        if cfg.max_steps:
            frac = max(frac if budget_s > 0 else 0.0, res.steps / cfg.max_steps)
        if frac >= 1.0:
            break
        cur = lr * min(1.0, (res.steps + 1) / cfg.warmup_steps)
        cur *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
        for gr in opt.param_groups:
            gr["lr"] = cur
        ids = sample()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss, metrics = loss_fn(ids)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        res.steps += 1
        res.tokens += ids.numel()
        if res.steps % cfg.log_every == 0 or res.steps == 1:
            m = {k: round(float(v), 4) for k, v in metrics.items()}
            lv = float(loss.detach())
            res.curve.append([res.steps, round(time.perf_counter() - t0, 2), round(lv, 4), m])
            bar.set_postfix(loss=f"{lv:.3f}", lr=f"{cur:.2e}", **m)
        if validate is not None and res.steps % cfg.val_every == 0:
            res.val_curve.append([res.steps, round(validate(), 4)])
        bar.update(1)
    bar.close()
    if validate is not None and (not res.val_curve or res.val_curve[-1][0] != res.steps):
        res.val_curve.append([res.steps, round(validate(), 4)])
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    res.seconds = time.perf_counter() - t0
    return res


def sampler(stream: torch.Tensor, batch: int, length: int, seed: int):
    """Random windows of `length` tokens from a token stream already on the device."""
    g = torch.Generator(device=stream.device).manual_seed(seed)
    offs = torch.arange(length, device=stream.device)

    def sample():
        starts = torch.randint(0, stream.numel() - length, (batch, 1), generator=g,
                               device=stream.device)
        return stream[starts + offs].long()
    return sample


@torch.no_grad()
def heldout_target_loss(target: LlamaForCausalLM, stream: torch.Tensor, cfg: TrainConfig,
                        dev) -> float:
    """Target loss (nats/byte) on the first cfg.val_windows held-out windows."""
    W = cfg.seq_len + 1
    n = max(1, min(stream.numel() // W, cfg.val_windows))
    windows = stream[: n * W].view(n, W).long()
    was_training = target.training
    target.eval()
    total = 0.0
    for i in range(0, n, cfg.batch):
        ids = windows[i: i + cfg.batch]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            total += float(target_loss(target, ids)[0]) * ids.shape[0]
    target.train(was_training)
    return total / n


@torch.no_grad()
def evaluate(target, asst, eagle, stream: torch.Tensor, cfg: TrainConfig, dev) -> dict:
    """Held-out figures over whole non-overlapping windows of seq_len+1 tokens."""
    W = cfg.seq_len + 1
    n = min(stream.numel() // W, max(1, cfg.eval_tokens // W))
    windows = stream[: n * W].view(n, W).long()
    sums: dict = {}
    for i in range(0, n, cfg.batch):
        ids = windows[i: i + cfg.batch]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            figs = {"target_loss": target_loss(target, ids)}
            if asst is not None:
                figs["assistant"] = assistant_loss(asst, ids[:, :-1], cfg.draft_steps)
            if eagle is not None:
                figs["eagle"] = eagle_loss(eagle, ids[:, :-1], cfg.draft_steps)
        w = ids.shape[0]
        for key, (loss, metrics) in figs.items():
            sums.setdefault(key, {"loss": 0.0})
            sums[key]["loss"] += float(loss) * w
            for mk, mv in metrics.items():
                sums[key][mk] = sums[key].get(mk, 0.0) + float(mv) * w
    out = {k: {mk: round(mv / n, 5) for mk, mv in v.items()} for k, v in sums.items()}
    out["windows"], out["tokens"] = n, n * W
    out["target_bits_per_byte"] = round(out["target_loss"]["loss"] / math.log(2), 5)
    return out


# -- output -----------------------------------------------------------------------------------

def _save_state(module: torch.nn.Module, directory: Path, config: dict, dtype) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in module.state_dict().items()}
    with atomic_path(directory / "model.safetensors") as tmp:
        save_file(sd, str(tmp), metadata={"format": "pt"})
    atomic_write_text(directory / "config.json", json.dumps(config, indent=2, sort_keys=True))


def write_token_counts(out: Path, corpus: Corpus, vocab: int) -> None:
    """out/token_counts.json: each id's count in the training split (a hot draft
    vocabulary's ranking, zoo.token_counts)."""
    doc = {"split": "train", "python_version": corpus.python_version,
           "train_tokens": int(corpus.train.numel()),
           "counts": token_counts(corpus.train, vocab)}
    atomic_write_text(out / "token_counts.json", json.dumps(doc))


def tokenizer_description(vocab: int) -> dict:
    return {"type": "byte", "vocab_size": vocab, "pad_token_id": 0, "bos_token_id": 1,
            "eos_token_id": 2, "byte_offset": BYTE0,
            "layout": f"0 <pad>, 1 <bos>, 2 <eos>, {BYTE0}..{BYTE0 + 255} = bytes 0..255 "
                      f"(UTF-8), {BYTE0 + 256}..{vocab - 1} unused",
            "documents": "each file is <bos> + its bytes + <eos>; prompts start with <bos>"}


def _manifest(cfg: TrainConfig, corpus: Corpus, dev, stages: dict, models: dict,
              heldout: Optional[dict], timings: dict) -> dict:
    return {
        "name": "tiny-code",
        "complete": heldout is not None,
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "git_commit": git_commit(),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.machine(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "train_config": asdict(cfg),
        "data": corpus.summary(),
        "params": {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()},
        "stages": {k: {"steps": v.steps, "seconds": round(v.seconds, 2), "tokens": v.tokens,
                       "tokens_per_s": round(v.tokens / max(v.seconds, 1e-9)),
                       "loss_curve": v.curve, "heldout_loss_curve": v.val_curve}
                   for k, v in stages.items()},
        "heldout": heldout,
        "timings": {k: round(v, 2) for k, v in timings.items()},
    }


def run(cfg: TrainConfig) -> dict:
    """All stages; each stage's weights (and a partial manifest) are written as soon as the
    stage ends, the final manifest after the held-out evaluation. Returns the manifest."""
    t_start = time.perf_counter()
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu")
                       if cfg.device == "auto" else cfg.device)
    torch.manual_seed(cfg.seed)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "tokenizer.json",
                      json.dumps(tokenizer_description(cfg.vocab), indent=2))
    dtype = getattr(torch, cfg.save_dtype)
    corpus: Corpus = load_corpus(cfg.corpus_root, max_files=cfg.max_files)
    write_token_counts(out, corpus, cfg.vocab)
    train_stream, held_stream = corpus.train.to(dev), corpus.heldout.to(dev)
    timings = {"corpus_s": time.perf_counter() - t_start}
    print(f"corpus: {len(corpus.train_files)} train files ({corpus.train.numel()} tokens), "
          f"{len(corpus.heldout_files)} held-out ({corpus.heldout.numel()} tokens)", flush=True)
    stages: dict = {}
    models: dict = {}

    def finish(name: str, module: torch.nn.Module, res: StageResult, save: Callable) -> None:
        stages[name], models[name] = res, module
        timings[f"{name}_s"] = res.seconds
        save()
        atomic_write_text(out / "manifest.json", json.dumps(
            _manifest(cfg, corpus, dev, stages, models, None, timings), indent=1))

    tcfg = cfg.target_config()
    target = LlamaForCausalLM(tcfg)
    init_weights(target, cfg.seed, tcfg.num_hidden_layers)
    target.to(dev).train()
    res = train_stage("target", target.parameters(), lambda ids: target_loss(target, ids),
                      sampler(train_stream, cfg.batch, cfg.seq_len + 1, cfg.seed), cfg,
                      cfg.target_lr, cfg.target_seconds, dev,
                      validate=lambda: heldout_target_loss(target, held_stream, cfg, dev))
    target.eval().requires_grad_(False)
    finish("target", target, res, lambda: save_model(target, out / "target", dtype=dtype))

    def train_draft(name: str, draft: torch.nn.Module, loss: Callable, seed_offset: int,
                    num_layers: int, seconds: float, meta: dict) -> None:
        """A draft stage: init, train on `loss(draft, ids, draft_steps)`, save with `meta`."""
        init_weights(draft, cfg.seed + seed_offset, num_layers)
        draft.to(dev).train()
        res = train_stage(name, draft.parameters(),
                          lambda ids: loss(draft, ids, cfg.draft_steps),
                          sampler(train_stream, cfg.batch, cfg.seq_len, cfg.seed + seed_offset),
                          cfg, cfg.draft_lr, seconds, dev)
        draft.eval()
        finish(name, draft, res, lambda: _save_state(draft, out / name, meta, dtype))

    acfg = assistant_config(tcfg)
    asst = FrozenKVAssistant(acfg, target)
    train_draft("assistant", asst, assistant_loss, 1, acfg.num_layers, cfg.assistant_seconds,
                {"format": "mtplab-frozen-kv-assistant", **asdict(acfg)})
    eagle = EagleDraft(target)
    train_draft("eagle", eagle, eagle_loss, 2, 1, cfg.eagle_seconds,
                {"format": "mtplab-eagle-draft", "target_hidden_size": tcfg.hidden_size})

    t0 = time.perf_counter()
    heldout = evaluate(target, asst, eagle, held_stream, cfg, dev)
    timings["eval_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start
    manifest = _manifest(cfg, corpus, dev, stages, models, heldout, timings)
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=1))
    print(json.dumps({"heldout": heldout, "timings": manifest["timings"]}), flush=True)
    return manifest


def parse_args(argv=None) -> TrainConfig:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = TrainConfig(out="")
    for f in TrainConfig.__dataclass_fields__.values():
        flag = "--" + f.name.replace("_", "-")
        d = getattr(defaults, f.name)
        if f.name == "out":
            ap.add_argument(flag, required=True)
        elif f.name in ("max_steps", "max_files"):
            ap.add_argument(flag, type=int, default=d)
        elif f.name == "corpus_root":
            ap.add_argument(flag, default=d)
        else:
            ap.add_argument(flag, type=type(d), default=d)
    return TrainConfig(**vars(ap.parse_args(argv)))


def main(argv=None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
