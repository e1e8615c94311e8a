"""Record plain PyTorch traces (no mtplab code in the profiled program): Hugging Face
transformers' `generate` (greedy, and assisted generation with a 1-layer assistant) on a tiny
random Llama on the GPU, under torch.profiler with one ProfilerStep#N per generate call, then
analyse them with mtplab's analyser and print the cause split (target: `other` <= 10% of
bubble time).

    python -m benchmarks.record_plain_trace --out-dir $OUT
writes
    plain_small.pt.trace.json.gz   2 profiled generates: small enough for tests/data
    plain_large.pt.trace.json.gz   --large-steps profiled generates (~60 MB of JSON once
                                   gunzipped: the trace of benchmarks/bench_analyzer.py --cli)
and prints, per trace, its size and the bubble split by cause with PASS/MISS.
"""
from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
from pathlib import Path

import torch


def models(device: str):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    base = dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=1,
                eos_token_id=2, pad_token_id=0)
    target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=4, **base)).to(device).eval()
    assistant = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, **base)).to(device).eval()
    return target, assistant


def record(path: Path, steps: int, new_tokens: int, device: str) -> Path:
    """Profile `steps` generate calls (alternating greedy and assisted) into `path` (.json.gz)."""
    from torch.profiler import ProfilerActivity, profile, schedule
    target, assistant = models(device)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 2048, (1, 48), generator=g).to(device)
    mask = torch.ones_like(ids)
    kw = dict(max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)

    def run(k: int):
        with torch.no_grad():
            target.generate(ids, attention_mask=mask, **kw,
                            **({"assistant_model": assistant} if k % 2 else {}))

    run(0)
    run(1)                                            # warm-up outside the profiler
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / "t.json"

        def ready(prof):
            prof.export_chrome_trace(str(tmp))
        acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=steps),
                     on_trace_ready=ready) as prof:
            for k in range(steps + 2):
                run(k)
                prof.step()
        path.write_bytes(gzip.compress(tmp.read_bytes(), compresslevel=6))
    return path


def report(path: Path) -> bool:
    from mtplab.analysis.bubbles import analyze
    res = analyze(path, skip_steps=1)
    s = res.summary
    mb = len(gzip.decompress(path.read_bytes())) / 1e6
    other = s["bubble_other_us"] / s["bubble_us"] if s["bubble_us"] else float("nan")
    ok = other <= 0.10
    print(f"{path.name}: {mb:.1f} MB JSON, {s['n_steps']} steps ({s['step_source']}), bubble "
          f"{100 * s['bubble_frac']:.1f}% of wall")
    for cause, us in s["bubble_by_cause_us"].items():
        print(f"    {cause:<16} {100 * us / s['bubble_us']:5.1f}% of bubble time")
    print(f"    other = {100 * other:.1f}% of bubble time (target <= 10%): "
          f"{'PASS' if ok else 'MISS'}")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--new-tokens", type=int, default=36)
    ap.add_argument("--small-new-tokens", type=int, default=8,
                    help="new tokens per generate of the small trace (tests/data size)")
    ap.add_argument("--large-steps", type=int, default=2,
                    help="profiled generate calls of the large trace (raise for a larger file)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("record_plain_trace needs a CUDA device.", file=sys.stderr)
        return 2
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    small = record(out / "plain_small.pt.trace.json.gz", 2, a.small_new_tokens, "cuda")
    large = record(out / "plain_large.pt.trace.json.gz", a.large_steps, a.new_tokens, "cuda")
    ok = report(small) & report(large)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
