"""How does mtplab compare with a peer on the same weights? Hugging Face transformers greedy
decode and assisted generation with the tiny-code target, against mtplab (frozen_kv_mtp,
overlap + zero_bubble, CUDA graphs), bs 1, the same prompts, the same max tokens, the same
dtype (float32, TF32 off, so the greedy tokens of all three must match exactly — which makes
the comparison honest).

mtplab's tok/s is a sweep cell (mtplab.sweep: the one measurement procedure; its timed
generate runs the prompts one at a time, batch_size 1); the tokens it is compared on come
from an engine of the same config in this process. transformers is timed here: a warm-up
call per path, then each prompt once per path (tok/s = new tokens / wall time, prefill
included, as for mtplab's `tok_per_s`).

The assistant for transformers is the tiny-code target truncated to its first 2 layers (+ final
norm and LM head): the Frozen-KV assistant and the EAGLE draft need the target's hidden states,
which transformers' assisted generation cannot feed.

    python -m benchmarks.bench_peer [--prompts 4] [--new-tokens 128] [--out table.md]
"""
from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time

import torch

from mtplab.studies.run_cells import emit, sweep
from mtplab import Engine, RunConfig
from mtplab.models.zoo import ZOO_DIR
from mtplab.sweep.measure import code_prompts

CFG = dict(model="tiny-code", draft="frozen_kv_mtp", fold_seed=True, overlap=True,
           zero_bubble=True, dtype="float32", context_len=1024)
PROMPT_TOKENS = 256


DEV = "cuda" if torch.cuda.is_available() else "cpu"


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(fn):
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with tempfile.TemporaryDirectory() as d:
        cell = sweep({"base": {**CFG, "batch_size": 1, "num_requests": a.prompts,
                               "prompts": "code", "prompt_len_tokens": PROMPT_TOKENS,
                               "output_len_tokens": a.new_tokens,
                               "warmup_output_len_tokens": 16, "event_timeline": False}},
                     d).iloc[0]
    eng = Engine(RunConfig(**CFG, max_running_requests=1))
    prompts = code_prompts(eng.tokenizer, a.prompts, PROMPT_TOKENS)     # the cell's prompts
    ours = eng.generate(prompts, max_new_tokens=a.new_tokens, ignore_eos=True)
    eng.check_invariants()
    hf = AutoModelForCausalLM.from_pretrained(ZOO_DIR / "tiny-code" / "target",
                                              torch_dtype=torch.float32).to(DEV).eval()
    small = copy.deepcopy(hf)
    small.model.layers = small.model.layers[:2]
    small.config.num_hidden_layers = 2
    kw = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False,
              pad_token_id=0)
    ids0 = torch.tensor([prompts[0]], device=DEV)                        # warm-up both paths
    hf.generate(ids0, max_new_tokens=8, do_sample=False, pad_token_id=0)
    hf.generate(ids0, assistant_model=small, max_new_tokens=8, do_sample=False, pad_token_id=0)
    secs = {"hf greedy": [], "hf assisted": []}
    match = True
    for p, mine in zip(prompts, ours):
        ids = torch.tensor([p], device=DEV)
        g, t = timed(lambda ids=ids: hf.generate(ids, **kw))
        secs["hf greedy"].append(t)
        s, t = timed(lambda ids=ids: hf.generate(ids, assistant_model=small, **kw))
        secs["hf assisted"].append(t)
        match &= mine == g[0, len(p):].tolist() == s[0, len(p):].tolist()
    tps = {"mtplab": float(cell["tok_per_s"]),
           **{k: a.new_tokens * len(v) / sum(v) for k, v in secs.items()}}
    rows = [f"tiny-code, bs 1, {len(prompts)} held-out stdlib prompts of {PROMPT_TOKENS} "
            f"tokens, {a.new_tokens} new tokens each, float32 (TF32 off); greedy tokens "
            f"identical across all three: {match}",
            "", "| engine | tok/s | mtplab / engine |", "|---|---|---|"]
    for k, v in tps.items():
        rows.append(f"| {k} | {v:.1f} | {tps['mtplab'] / v:.2f}x |")
    text = "\n".join(rows)
    emit(text, a.out)
    return 0 if match else 1


if __name__ == "__main__":
    sys.exit(main())
