"""Record three Kineto traces of programs that are not mtplab, with torch.profiler's defaults
(no `with_stack`, no `record_shapes`: the profiler records aten ops and CUDA calls, never the
Python between them), and cut a small piece of each for tests/data.

    python -m benchmarks.record_foreign_traces record --out-dir $OUT      # needs CUDA
    python -m benchmarks.record_foreign_traces cut RAW CUT [--keep-ms 40]  # any machine
    python -m benchmarks.record_foreign_traces report TRACE...             # the cause split

`record` writes, in one process (random-init models, nothing downloaded):
    hf_assisted.pt.trace.json.gz  transformers assisted generation: a 4-layer Llama target,
                                  a 1-layer assistant, 2 generate calls under `profile()`
    hf_greedy.pt.trace.json.gz    the same target, greedy, 2 generate calls under `profile()`
    torch_train.pt.trace.json.gz  a plain training step (the same target shape, AdamW, the
                                  next batch prefetched on a side stream), under
                                  `profile(schedule=...)` with `prof.step()`: ProfilerStep#N
Generation traces have no step spans (the analyser cuts fixed windows); the training trace
has one ProfilerStep#N per step. `cut` keeps the host events inside the first `--keep-ms`
after the first GPU activity (the step spans around them, whole) and the GPU events those
host events launched, so every kept kernel keeps its launch call. `report` prints each
trace's bubble and its split by cause (goal: `other` <= 10% of the bubble).
"""
from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
from pathlib import Path

import orjson

VOCAB = 2048
NEW_TOKENS = 32


def _models(device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    base = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=1,
                eos_token_id=2, pad_token_id=0)
    target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=4, **base)).to(device)
    assistant = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, **base)).to(device)
    return target, assistant


def _export(prof, path: Path) -> Path:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / "t.json"
        prof.export_chrome_trace(str(tmp))
        path.write_bytes(gzip.compress(tmp.read_bytes(), compresslevel=6))
    return path


def record_generate(path: Path, target, assistant, device: str, calls: int = 2) -> Path:
    """`calls` greedy generate calls (assisted when `assistant` is given) under `profile()`."""
    import torch
    from torch.profiler import profile
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (1, 48), generator=g).to(device)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
              min_new_tokens=NEW_TOKENS, do_sample=False)
    if assistant is not None:
        kw["assistant_model"] = assistant
    target.eval()
    with torch.no_grad():
        target.generate(ids, **kw)                       # warm-up, not recorded
        with profile() as prof:                          # the profiler's defaults
            for _ in range(calls):
                target.generate(ids, **kw)
    return _export(prof, path)


def record_train(path: Path, model, device: str, steps: int = 4) -> Path:
    """A training loop: the next batch is copied on a side stream while the step runs."""
    import torch
    from torch.profiler import profile, schedule
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(2)
    host = [torch.randint(3, VOCAB, (8, 128), generator=g).pin_memory()
            if device.startswith("cuda") else torch.randint(3, VOCAB, (8, 128), generator=g)
            for _ in range(2)]
    side = torch.cuda.Stream() if device.startswith("cuda") else None

    def fetch(k):
        if side is None:
            return host[k % 2].to(device)
        with torch.cuda.stream(side):
            x = host[k % 2].to(device, non_blocking=True)
        x.record_stream(torch.cuda.current_stream())      # used on the compute stream
        return x

    def step(k, batch):
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
        nxt = fetch(k + 1)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return nxt, float(loss.detach())                 # .item(): a host sync per step

    batch = fetch(0)
    for k in range(2):                                   # warm-up, not recorded
        batch, _ = step(k, batch)
    with profile(schedule=schedule(wait=1, warmup=1, active=steps)) as prof:
        for k in range(steps + 2):
            batch, _ = step(k, batch)
            prof.step()
    return _export(prof, path)


def record(out: Path, device: str = "cuda") -> list[Path]:
    """The three traces (module doc); `device="cpu"` checks the script without a GPU."""
    import torch
    import transformers
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("record_foreign_traces record needs a CUDA device (--device cpu "
                         "checks the script without one).")
    out.mkdir(parents=True, exist_ok=True)
    target, assistant = _models(device)
    paths = [record_generate(out / "hf_assisted.pt.trace.json.gz", target, assistant, device),
             record_generate(out / "hf_greedy.pt.trace.json.gz", target, None, device),
             record_train(out / "torch_train.pt.trace.json.gz", target, device)]
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {name}")
    return paths


# --------------------------------------------------------------------------- cut and report

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LANE_CATS = GPU_CATS | {"gpu_user_annotation", "cuda_sync", "ac2g"}


def cut(raw: Path, dst: Path, keep_ms: float) -> Path:
    """Keep the first `keep_ms` of host activity after the first GPU activity (see the module
    doc); metadata events stay, the document's top-level keys too."""
    doc = orjson.loads(gzip.decompress(raw.read_bytes()) if raw.suffix == ".gz"
                       else raw.read_bytes())
    ev = doc["traceEvents"]
    timed = [e for e in ev if e.get("ph") == "X" and e.get("cat") != "Trace"]
    t0 = min(e["ts"] for e in timed if e.get("cat") in GPU_CATS)
    t1 = t0 + 1e3 * keep_ms
    host = [e for e in timed if e.get("cat") not in LANE_CATS]
    kept_host = [e for e in host
                 if t0 <= e["ts"] <= t1 or (e.get("cat") == "user_annotation"
                                            and e["ts"] < t1 and e["ts"] + e["dur"] > t0)]
    corr = {e["args"]["correlation"] for e in kept_host
            if isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    lane = [e for e in timed if e.get("cat") in LANE_CATS and e.get("cat") != "ac2g"]
    kept_lane = [e for e in lane
                 if (e.get("args") or {}).get("correlation") in corr
                 or (e.get("cat") == "gpu_user_annotation" and t0 <= e["ts"] <= t1)]
    flows = [e for e in ev if e.get("cat") == "ac2g" and e.get("id") in corr]
    meta = [e for e in ev if e.get("ph") == "M"]
    doc["traceEvents"] = meta + kept_host + kept_lane + flows
    dst.write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=9))
    return dst


def report(path: Path) -> float:
    """Print the trace's bubble split by cause; return `other`'s share of the bubble."""
    from mtplab.analysis.bubbles import analyze_run
    res = analyze_run(path)
    s = res.summary
    other = s["bubble_other_us"] / s["bubble_us"] if s["bubble_us"] else float("nan")
    print(f"{path.name}: {path.stat().st_size / 1e3:.0f} kB, {s['n_steps']} steps "
          f"({s['step_source']}), bubble {s['bubble_frac']:.1%} of wall, other "
          f"{other:.1%} of the bubble (goal <= 10%): {'PASS' if other <= 0.10 else 'MISS'}")
    for cause, us in s["bubble_by_cause_us"].items():
        print(f"    {cause:<18} {us / s['bubble_us']:6.1%}")
    return other


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record the three traces (CUDA)")
    r.add_argument("--out-dir", required=True)
    r.add_argument("--device", default="cuda")
    c = sub.add_parser("cut", help="cut a small piece of a trace")
    c.add_argument("raw")
    c.add_argument("dst")
    c.add_argument("--keep-ms", type=float, default=40.0)
    p = sub.add_parser("report", help="the cause split of traces")
    p.add_argument("traces", nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "record":
        paths = record(Path(a.out_dir), a.device)
    elif a.cmd == "cut":
        paths = [cut(Path(a.raw), Path(a.dst), a.keep_ms)]
    else:
        paths = [Path(t) for t in a.traces]
    shares = [report(p) for p in paths]
    return 0 if all(s <= 0.10 for s in shares) else 1


if __name__ == "__main__":
    sys.exit(main())
