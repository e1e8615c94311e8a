"""The MoE target and the reduced draft head, measured in one process on one GPU (the `moe`
figures; docs/results/moe/ and docs/results/drafts/; entry point: benchmarks/bench_moe.py).

    python -m benchmarks.bench_moe --out FILE [--budget-s 420] [--layers 30] [--only NAME ...]

Figures, in this order (the costliest last), each under a shared time budget (a figure not
reached prints SKIPPED):
  experts   gemma4-26b-a4b-like at full depth (bf16, eager, moe_stats: models/moe.py
            ExpertRecorder): distinct experts touched per layer by one verify forward of
            bs x D tokens, bs 1 / 8 / 32 / 64, D = verify tokens 1 / 4 / 8 (a frozen_kv_mtp
            draft of D-1 steps, simulated acceptance), beside uniform routing's
            expectation E(1 - (1 - k/E)^(bs D)); and the target weight bytes one step reads
            (models/floor.py step_bytes with the measured count)
  floor     target-only decode of the same preset, CUDA graphs, fused, overlap + zero_bubble,
            bs 1 and 8: floor = the step's bytes (the experts it touched, measured at D = 1) /
            copy bandwidth; ratio = floor / step (target >= 0.70); then where the time goes:
            the kernels of one eager bs-1 decode forward by total time
  vocab     tiny-code frozen_kv_mtp and eagle, full vs hot:N heads (N from the training
            split's counts): decode tok/s at bs 1 and 8 on held-out code (CUDA graphs), the
            LM head's share of one draft forward (CUDA events around the head GEMM vs the whole
            draft forward, graph-captured, median of replays), the escape share (emitted tokens
            outside the hot set) and the accept length
  speedup   frozen_kv_mtp (fold_seed, S = 3, simulated acceptance 3.0) vs target-only decode
            tok/s at bs 1 / 8 / 32 / 64 (every bs in a CUDA graph; median of 3 decodes of 64
            tokens), the MoE preset next to gemma4-31b-like (dense) at the same acceptance:
            the spec speedup per bs, and where it falls below 1 (break-even)
Drives engines directly (as the decode-floor figures do): the figures read model internals (routers,
the draft head) that a sweep row does not carry.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from mtplab import Engine, RunConfig
from mtplab.models.draft_vocab import escape_share
from mtplab.models.floor import expected_experts, step_bytes
from mtplab.studies.gpu_figures import (Report, copy_bandwidth, decode_forward, free,
                                        gpu_activities, graph_us, prompts)
from mtplab.studies.run_cells import emit

FIGURES = ("experts", "floor", "vocab", "speedup")
MOE, DENSE = "gemma4-26b-a4b-like", "gemma4-31b-like"
BATCHES = (1, 8, 32, 64)
VERIFY = (1, 4, 8)
PROMPT = 64
BASE = dict(device="cuda", page_size=16, context_len=512, fused=True)


def experts_per_step(eng: Engine, bs: int, steps: int = 4) -> float:
    """Distinct experts per MoE layer per verify, mean over the verifies of a generate of
    1 + steps tokens (the engine's moe_stats: the lanes' own tokens, the prefill not
    counted)."""
    eng.generate(prompts(eng.model.config.vocab_size, bs, PROMPT), max_new_tokens=1 + steps,
                 ignore_eos=True)
    return eng.stats()["experts_per_verify"]


def fig_experts(rep: Report, layers: int) -> dict:
    """-> {(bs, D): mean experts per layer}."""
    out = {}
    for D in VERIFY:
        if rep.left() < 40:
            rep.add(f"experts D={D}", "SKIPPED (time box)")
            continue
        kw = {} if D == 1 else dict(draft="frozen_kv_mtp", num_steps=D - 1,
                                    simulate_accept_len=1.0)
        eng = Engine(RunConfig(model=MOE, layers=layers, max_running_requests=max(BATCHES),
                               cuda_graphs=False, overlap=False, moe_stats=True, **BASE, **kw))
        c = eng.model.config
        for bs in BATCHES:
            mean = experts_per_step(eng, bs)
            out[(bs, D)] = mean
            wb = step_bytes(c, dtype_bytes=2, bs=bs, context=PROMPT, experts_touched=mean,
                            draft="none" if D == 1 else "frozen_kv_mtp",
                            num_steps=D - 1, num_draft_tokens=D).target_weights
            rep.add(f"experts/layer bs {bs} D {D}",
                    f"{mean:.1f} of {c.num_experts} (uniform: "
                    f"{expected_experts(c, bs * D):.1f}); target weights read "
                    f"{wb / 1e9:.2f} GB/step")
        free(eng)
    return out


def decode(eng: Engine, bs: int, new_tokens: int) -> dict:
    V = eng.model.config.vocab_size
    eng.generate(prompts(V, bs, PROMPT), max_new_tokens=8, ignore_eos=True)        # warm-up
    eng.generate(prompts(V, bs, PROMPT, seed=1), max_new_tokens=new_tokens, ignore_eos=True)
    return eng.stats()


def fig_floor(rep: Report, bw: float, layers: int, experts: dict) -> None:
    if rep.left() < 60:
        rep.add("floor", "SKIPPED (time box)", ">= 0.70", False)
        return
    eng = Engine(RunConfig(model=MOE, layers=layers, max_running_requests=8, overlap=True,
                           zero_bubble=True, **BASE))
    c = eng.model.config
    for bs in (1, 8):
        st = decode(eng, bs, 48)
        step = st["decode_step_p50_ms"]
        touched = experts.get((bs, 1))
        b = step_bytes(c, dtype_bytes=2, bs=bs, context=PROMPT + 24, experts_touched=touched)
        floor = 1e3 * b.total / bw
        rep.add(f"MoE target-only bs {bs}: floor/step",
                f"{floor / step:.3f} (floor {floor:.3f} ms at "
                f"{'measured' if touched else 'uniform'} experts, step {step:.3f} ms)",
                ">= 0.70", floor / step >= 0.70)
    kernel_table(rep, eng)
    free(eng)


def kernel_table(rep: Report, eng: Engine, top: int = 6) -> None:
    """Where a bs-1 decode step's GPU time goes: the kernels of one eager decode forward
    (the kernels a graph replays), by total time, with their share of the forward's."""
    with torch.no_grad():
        _, names, _ = gpu_activities(decode_forward(eng))
    total = sum(us for _, us in names.values())
    rep.add("MoE bs 1 forward, GPU time", f"{total / 1e3:.3f} ms in "
            f"{sum(c for c, _ in names.values())} kernels")
    for name, (count, us) in sorted(names.items(), key=lambda kv: -kv[1][1])[:top]:
        rep.add(f"  kernel {name[:60]}",
                f"{us / 1e3:.3f} ms ({us / max(total, 1e-9):.0%}), {count} launches")


def fig_speedup(rep: Report, layers_of: dict, repeats: int = 3) -> None:
    """Every bs runs in a CUDA graph (the bucket cap raised to the largest bs); each tok/s is
    the median of `repeats` decodes of 64 tokens, with their spread (max/min - 1) beside it."""
    for model in (MOE, DENSE):
        tps: dict = {}
        for arm in ("none", "frozen_kv_mtp"):
            if rep.left() < 60:
                rep.add(f"speedup {model} {arm}", "SKIPPED (time box)")
                continue
            kw = {} if arm == "none" else dict(draft="frozen_kv_mtp", fold_seed=True,
                                               num_steps=3, simulate_accept_len=3.0)
            eng = Engine(RunConfig(model=model, layers=layers_of[model],
                                   max_running_requests=max(BATCHES),
                                   cuda_graph_max_bs=max(BATCHES), overlap=True,
                                   zero_bubble=True, **BASE, **kw))
            for bs in BATCHES:
                if rep.left() < 20:
                    break
                tps[(arm, bs)] = [decode(eng, bs, 64)["decode_tok_per_s"]
                                  for _ in range(repeats)]
            free(eng)
        for bs in BATCHES:
            t, s = tps.get(("none", bs)), tps.get(("frozen_kv_mtp", bs))
            if t and s:
                mt, ms = statistics.median(t), statistics.median(s)
                rep.add(f"spec speedup {model} bs {bs}",
                        f"{ms / mt:.2f}x (target-only {mt:.0f} tok/s ±{spread(t):.1%}, "
                        f"frozen accept 3.0 {ms:.0f} tok/s ±{spread(s):.1%})")


def spread(xs: list[float]) -> float:
    return max(xs) / min(xs) - 1


def head_share(eng: Engine, reps: int = 30) -> float:
    """The LM head's share of one draft forward: head GEMM time / draft forward time, each
    captured 10x in a CUDA graph, median of replays."""
    d = eng.draft_model
    w = d.head_weight
    dev = w.device
    H = eng.model.config.hidden_size
    s = torch.randn(1, w.shape[1], device=dev, dtype=w.dtype)
    tok = torch.ones(1, dtype=torch.long, device=dev)
    hid = torch.randn(1, H, device=dev, dtype=w.dtype)

    head = graph_us(lambda: d.logits_of(s), reps=10, replays=reps)
    dw = eng.worker.draft_worker
    seq = torch.full((1,), PROMPT, dtype=torch.int32, device=dev)
    rows = torch.ones(1, dtype=torch.long, device=dev)
    if hasattr(dw, "_meta"):                     # a Frozen-KV draft: one seed forward
        meta = dw._meta(rows, seq, PROMPT + 8)
        whole = graph_us(lambda: dw._forward(tok, hid, meta), reps=10, replays=reps)
    else:
        whole = float("nan")
    return head / whole


def fig_vocab(rep: Report) -> None:
    from mtplab.models.corpus import heldout_snippets
    from mtplab.models.zoo import build_target
    tok = build_target("tiny-code")[1]
    ps = [tok.encode(t) for t in heldout_snippets(8, 256)]
    for draft in ("frozen_kv_mtp", "eagle"):
        for vocab in ("full", "hot:128", "hot:64", "hot:32"):
            if rep.left() < 25:
                rep.add(f"vocab {draft} {vocab}", "SKIPPED (time box)")
                continue
            eng = Engine(RunConfig(model="tiny-code", draft=draft, draft_vocab=vocab,
                                   fold_seed=draft == "frozen_kv_mtp", overlap=True,
                                   zero_bubble=True, max_running_requests=8, device="cuda",
                                   context_len=1024))
            tps = {}
            for bs in (1, 8):
                eng.generate(ps[:bs], 8, ignore_eos=True)
                out = eng.generate(ps[:bs], 128, ignore_eos=True)
                st = eng.stats()
                tps[bs] = st["decode_tok_per_s"]
            esc = escape_share(out, eng.draft_model.vocab_ids)
            share = head_share(eng) if draft == "frozen_kv_mtp" else float("nan")
            rep.add(f"tiny-code {draft} draft_vocab={vocab}",
                    f"tok/s bs1 {tps[1]:.0f} bs8 {tps[8]:.0f}; accept {st['accept_len']:.2f}; "
                    f"escape {esc:.1%}; LM head share of a draft forward {share:.0%}")
            free(eng)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_moe",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--layers", type=int, default=30, help="MoE preset depth (full: 30)")
    ap.add_argument("--dense-layers", type=int, default=60, help="31B preset depth (full: 60)")
    ap.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES))
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_moe needs CUDA.")
        return 2
    rep = Report(a.budget_s)
    bw = copy_bandwidth()
    rep.add("copy bandwidth", f"{bw / 1e9:.0f} GB/s")
    experts: dict = {}
    if "experts" in a.only:
        experts = fig_experts(rep, a.layers)
    if "floor" in a.only:
        fig_floor(rep, bw, a.layers, experts)
    if "vocab" in a.only:
        fig_vocab(rep)
    if "speedup" in a.only:
        fig_speedup(rep, {MOE: a.layers, DENSE: a.dense_layers})
    head = (f"bench_moe on {torch.cuda.get_device_name()}; {time.strftime('%Y-%m-%d')}; "
            f"MoE depth {a.layers}, dense depth {a.dense_layers}")
    emit(head + "\n\n" + rep.table(), a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
