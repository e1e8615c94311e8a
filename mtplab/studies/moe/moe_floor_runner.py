"""An MoE decode step against its floor: the split and the grouped MoE kernels (RunConfig
`moe_kernels`, models/moe.py) side by side in one process on one GPU, with kernels per
layer and where each microsecond goes; writes the dated report of question `moe_floor`
(moe_floor.py here: the results file and the Markdown rendered from it) into the results
folder --out-dir (entry point: benchmarks/bench_moe_floor.py):

    DIR/moe_floor/<YYYY-MM-DD>_<device>_<commit>.{json,md}      (DIR default docs/results)

    PYTHONUNBUFFERED=1 python -m benchmarks.bench_moe_floor --out-dir DIR [--layers 30]
        [--batches 1 8 32] [--repeats 3] [--tokens 48] [--budget-s 400]

The commit is MTP_GIT_COMMIT where set (a device's copy of a checkout), else this checkout's
HEAD; a tree with uncommitted changes is refused before anything runs. `mtplab report
moe_floor` renders the report again from its results file.

Phases, in this order, each in its own try (a failing phase prints ERROR with its traceback
and the others still run, the report says how each phase ended), each printed as it is
measured:
  bandwidth  device-to-device copy, bytes read + written / time, 3 measurements (the floor's
             bandwidth: their median; their spread is reported)
  check      the grouped set at the Gemma-4 26B-A4B widths (bf16) against its torch
             references: routing ids (where the top 9 logits have no near-tie), weights and
             gate; the alignment against torch's `align` of the same ids; the FFN output; the
             counters left zero; a CUDA-graph replay == eager
  ffn        one MoE layer's FFN at T = 1 / 8 / 32 tokens, split vs grouped: device µs per
             call (the call captured 20x in a CUDA graph, median of replays; 3 captures per
             arm, their spread the noise) and kernels per call (one captured call,
             torch.profiler); the grouped arm's routing kernel alone (with the shared
             expert's act rows, as the engine launches it), the same way, at 4
             (its default), 8 and 16 warps a program, with its serial work
             (kernels/moe_route.py serial_work)
  library    the routed experts of one MoE layer at T = 1 / 8 / 32, mtplab's grouped kernels
             beside SGLang's fused MoE (moe_library.py), both from the layer's input: device
             µs per call (FFN_CAPTURES captures each, the arms alternating), kernels per call,
             each output against the torch reference; where SGLang does not import, the
             report says so and how to run it (scripts/sglang_h100.sh moe)
  decode     gemma4-26b-a4b-like@L target-only, overlap + zero_bubble, CUDA graphs, fused,
             bf16, page 16, random 64-token prompts: p50 decode step at each bs, both arms'
             engines built (together when the memory holds both, else one after the other)
             and the arms interleaved over repeats; noise = max/min - 1 over the repeats
  floor      the bytes one step reads (models/floor.py step_bytes: every parameter once, the
             tied embedding as the LM head, per MoE layer the experts touched by bs random
             tokens, counted on one eager forward; the KV in context) / the bandwidth ->
             floor / step per arm and bs
  kernels    one bs-1 decode forward per arm captured in a CUDA graph and traced: GPU
             activities per step, per decoder layer ((k(L) - k(L - 6)) / 6: one 5:1
             sliding:full period), the per-layer kernel table (count and µs per layer by
             kernel) and the whole step's (where each microsecond goes), the replay's wall
             time against the summed kernel time (the gaps)
  tiles      the grouped FFN at T = 1 / 8 / 32 (gemma widths, bf16, the shared expert folded
             in) with each kernel's launch shape (kernels/fused_moe.py TILES_16BIT) replaced
             by each of TILE_SWEEP in turn, the other kernel's kept: µs per call and the
             output against the torch reference; the engine's shapes are restored after
  report     DIR/moe_floor/<date>_<device>_<commit>.{json,md}: every measurement, and the
             ratios, noise, floors and verdicts computed from them

Drives engines directly (as moe_figures.py does): it reads model internals (routers, the target
worker's decode function) that a sweep row does not carry.
"""
from __future__ import annotations

import argparse
import functools
import gc
import shlex
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from mtplab import Engine, RunConfig
from mtplab.kernels import fused_moe as fm
from mtplab.kernels import moe_route as mr
from mtplab.models.floor import expected_experts, step_bytes
from mtplab.models.moe import MOE_KERNELS, recording
from mtplab.nogc import gc_paused
from mtplab.studies import reports as R
from mtplab.studies.gpu_figures import copy_bandwidth, depth, gpu_activities, graph_us, prompts
from mtplab.studies.moe import moe_floor as study
from mtplab.studies.moe import moe_library as ml
from mtplab.studies.run_cells import TimeBox, target_decode_fn

MOE = "gemma4-26b-a4b-like"
PROMPT = 64
PERIOD = 6                      # Gemma's 5:1 sliding:full pattern: one period of layers
FFN_CAPTURES = 3                # graph_us captures per arm and token count (their spread)
ROUTE_WARPS = (4, 8, 16)        # the routing kernel's warps a program, timed side by side
STEP_KERNELS = 25               # the whole step's kernel table: its busiest kernels
TILE_TOKENS = (1, 8, 32)        # the tiles phase's token counts
TILE_SWEEP = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st)
              for bn in (16, 32, 64) for bk in (64, 128) for w in (4, 8) for st in (2, 3, 4)]


class Log(TimeBox):
    """The run's results doc (studies/moe/moe_floor.py), filled phase by phase under a time box;
    each phase's section printed as it ends."""

    def __init__(self, doc: dict, budget_s: float):
        super().__init__(budget_s)
        self.doc = doc

    def note(self, text: str) -> None:
        print(text, flush=True)

    def phase(self, name: str, fn, *args, reserve_s: float = 20.0):
        """fn(*args) under a try: an exception is recorded with its traceback printed, never
        raised; the phase's section printed."""
        phases = self.doc["phases"]
        if self.left() < reserve_s:
            phases[name] = {"status": "skipped", "left_s": round(self.left(), 1)}
            print(study.section(self.doc, name), flush=True)
            return None
        t0 = time.perf_counter()
        try:
            out = fn(*args)
            phases[name] = {"status": "done", "seconds": round(time.perf_counter() - t0, 1)}
            return out
        except Exception as e:            # one phase failing must not hide the others
            phases[name] = {"status": "error", "error": f"{type(e).__name__}: {e}"}
            traceback.print_exc()
            gc.collect()
            torch.cuda.empty_cache()
            return None
        finally:
            if name in phases:
                print(study.section(self.doc, name), flush=True)


# -- bandwidth -------------------------------------------------------------------------------
def phase_bandwidth(log: Log) -> float:
    log.doc["bandwidth"] = [float(copy_bandwidth()) for _ in range(3)]
    return study.bandwidth(log.doc)


# -- check ------------------------------------------------------------------------------------
def gemma_case(T: int, seed: int):
    c = zoo_config(1)
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s, fan: (torch.randn(*s, generator=g, device="cuda")       # noqa: E731
                         / fan ** 0.5).to(torch.bfloat16)
    H, E, Im, Is = (c.hidden_size, c.num_experts, c.moe_intermediate_size,
                    c.shared_expert_intermediate_size)
    return (r(T, H, fan=1), r(E, H, fan=H), r(1, H, fan=H), r(E, 2 * Im, H, fan=H),
            r(E, H, Im, fan=Im), r(2 * Is, H, fan=H), r(H, Is, fan=Is))


def zoo_config(layers: int):
    from mtplab.models.zoo import model_config
    return model_config(f"{MOE}@{layers}")


def phase_check(log: Log) -> None:
    k, bm = zoo_config(1).num_experts_per_tok, fm.block_m("cuda")
    for T in (1, 8, 32, 256, 600):
        x, wr, wg, wgu, wd, sgu, sd = gemma_case(T, T)
        counts = torch.zeros(mr.counts_len(T), dtype=torch.int32, device="cuda")
        got = mr.route_align_triton(x, wr, None, wg, k, True, bm, counts, sgu)
        want = mr.route_align_ref(x, wr, None, wg, k, True, bm)
        top = (x.float() @ wr.float().T).sort(-1, descending=True).values
        clear = (top[:, :k] - top[:, 1:k + 1]).min(-1).values > 1e-4
        same_ids = torch.equal(got.ids[clear], want.ids[clear])
        dw = (got.weights[clear] - want.weights[clear]).abs().max().item()
        dg = (got.gate - want.gate).abs().max().item()
        s, be = fm.align(got.ids, wr.shape[0], bm)
        aligned = torch.equal(s, got.sorted_ids) and torch.equal(be, got.block_expert)
        out = fm.moe_ffn_triton(x, wgu, wd, got, sgu, sd)
        ref = fm.moe_ffn_ref(x, wgu, wd, got, sgu, sd)
        err = ml.rel_err(out, ref)
        zero = not counts.any()
        ok = same_ids and dw < 1e-5 and dg < 1e-5 and aligned and err < 2e-2 and zero
        log.doc["check"]["cases"].append(
            {"T": T, "ok": bool(ok), "clear": int(clear.sum()), "same_ids": bool(same_ids),
             "dw": dw, "dg": dg, "aligned": bool(aligned), "err": err,
             "counters_zero": bool(zero)})
    x, wr, wg, wgu, wd, sgu, sd = gemma_case(24, 5)
    counts = torch.zeros(mr.counts_len(24), dtype=torch.int32, device="cuda")

    def layer(h):
        r = mr.route_align_triton(h, wr, None, wg, k, True, bm, counts, sgu)
        return fm.moe_ffn_triton(h, wgu, wd, r, sgu, sd)

    full = layer(x)
    invariant = torch.equal(layer(x[3:4]), full[3:4])
    static = x.clone()
    layer(static)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(static)
    same = True
    for seed in (9, 10):
        fresh = gemma_case(24, seed)[0]
        static.copy_(fresh)
        graph.replay()
        same &= torch.equal(out, layer(fresh))
    log.doc["check"]["graph"] = {"batch_invariant": bool(invariant),
                                 "graph_eq_eager": bool(same),
                                 "counters_zero": not bool(counts.any())}


# -- ffn ---------------------------------------------------------------------------------------
def graph_trace(fn) -> tuple[int, dict, list, float]:
    """fn captured once in a CUDA graph: (GPU activities of one replay, {name: (count, µs)},
    names in launch order, replay wall µs = median of 20 replays between CUDA events)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with gc_paused(), torch.no_grad(), torch.cuda.graph(g):
        fn()
    n, names, order = gpu_activities(g.replay)
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(1e3 * s.elapsed_time(e))
    del g
    return n, names, order, statistics.median(times)


def moe_layer():
    """One gemma4-26b-a4b-like MoE FFN on the device (bf16, random weights, fused)."""
    from mtplab.models.moe import MoEFFN
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = MoEFFN(zoo_config(1))
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, p.shape[-1] ** -0.5)
    m = m.to(torch.bfloat16)
    m.fuse()
    return m


def ffn_rows(log: Log, m) -> None:
    """Per token count: the FFN of each arm (µs and kernels per call), the grouped arm's
    routing kernel alone at each of ROUTE_WARPS warps a program (µs per call), with its
    serial work (kernels/moe_route.py serial_work), and the grouped FFN with the shared
    expert's act rows computed by gate_up beside the engine's (by the routing launch), their
    captures alternating."""
    H, E = m.gate.weight.shape[1], m.num_experts
    bm = fm.block_m("cuda")
    sg, se = m.shared_expert_gate, m.shared_expert
    for T in (1, 8, 32):
        h = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        row = {"T": T}
        for kernels in MOE_KERNELS:
            m.kernels = kernels
            with torch.no_grad():
                row[f"{kernels}_us"] = [graph_us(lambda h=h: m.forward_fused(h))
                                        for _ in range(FFN_CAPTURES)]
            row[f"{kernels}_kernels"] = graph_trace(lambda h=h: m.forward_fused(h))[0]

        def route(h=h, warps=None, shared_rows=True):   # the engine's: the shared rows too
            return mr.route_align_triton(h, m.gate.weight, m.gate.bias,
                                         None if sg is None else sg.weight, m.top_k,
                                         m.norm_topk, bm, m.route_counts(h),
                                         se.gate_up_weight if se is not None and shared_rows
                                         else None, num_warps=warps)

        row["route"] = [{"warps": w, "us": [graph_us(functools.partial(route, warps=w))
                                            for _ in range(FFN_CAPTURES)]}
                        for w in ROUTE_WARPS]
        row["route_work"] = mr.serial_work(T, H, E, m.top_k, bm, torch.bfloat16)
        if se is not None:
            def in_gate_up(h=h, route=route):           # the shared rows computed by gate_up
                return fm.moe_ffn_triton(h, m.experts.gate_up_proj, m.experts.down_proj,
                                         route(shared_rows=False), se.gate_up_weight,
                                         se.down_proj.weight)

            m.kernels = "grouped"
            with torch.no_grad():
                pairs = [(graph_us(in_gate_up), graph_us(lambda h=h: m.forward_fused(h)))
                         for _ in range(FFN_CAPTURES)]
            row["shared_in_gate_up_us"] = [a for a, _ in pairs]
            row["shared_in_route_us"] = [b for _, b in pairs]
        log.doc["ffn"].append(row)


def phase_ffn(log: Log) -> None:
    ffn_rows(log, moe_layer())
    gc.collect()
    torch.cuda.empty_cache()


# -- library ---------------------------------------------------------------------------------
def phase_library(log: Log) -> None:
    lib = log.doc["library"]
    try:
        theirs = ml.sglang_routed()
    except ImportError as e:
        lib["unavailable"] = str(e)
        return
    lib.update(name=theirs.name, version=theirs.version)
    m = moe_layer()
    w = (m.gate.weight, m.gate.bias, m.experts.gate_up_proj, m.experts.down_proj, m.top_k,
         m.norm_topk)
    for T in (1, 8, 32):
        x = torch.randn(T, m.gate.weight.shape[1], device="cuda", dtype=torch.bfloat16)
        arms = {"mtplab": ml.mtplab_routed(m.route_counts(x)), "library": theirs}
        fns = {k: functools.partial(a.routed, x, *w) for k, a in arms.items()}
        ref = ml.reference(x, *w)
        ref_ids = ml.reference_routing(x, w[0], w[1], w[4], w[5]).ids
        row: dict = {"T": T}
        with torch.no_grad():
            for k, fn in fns.items():
                out = fn()
                weights, ids = arms[k].routing(x, w[0], w[1], w[4], w[5])
                row[f"{k}_err"] = ml.rel_err(out, ref)
                row[f"{k}_own_err"] = ml.rel_err(out, ml.reference_on(x, w[2], w[3], weights,
                                                                      ids))
                row[f"{k}_rerouted"] = ml.rerouted(ids, ref_ids)
                row[f"{k}_us"] = []
            for _ in range(FFN_CAPTURES):
                for k, fn in fns.items():
                    row[f"{k}_us"].append(graph_us(fn))
            for k, fn in fns.items():
                row[f"{k}_kernels"] = graph_trace(fn)[0]
        lib["rows"].append(row)
    del m
    gc.collect()
    torch.cuda.empty_cache()


# -- tiles -----------------------------------------------------------------------------------
def phase_tiles(log: Log) -> None:
    k, bm = zoo_config(1).num_experts_per_tok, fm.block_m("cuda")
    x, wr, wg, wgu, wd, sgu, sd = gemma_case(max(TILE_TOKENS), 3)
    cases = {}
    for T in TILE_TOKENS:
        xt = x[:T].contiguous()
        counts = torch.zeros(mr.counts_len(T), dtype=torch.int32, device="cuda")
        r = mr.route_align_triton(xt, wr, None, wg, k, True, bm, counts, sgu)
        cases[T] = (functools.partial(fm.moe_ffn_triton, xt, wgu, wd, r, sgu, sd),
                    fm.moe_ffn_ref(xt, wgu, wd, r, sgu, sd))
    saved = {kern: dict(t) for kern, t in fm.TILES_16BIT.items()}
    log.doc["tiles"] = {"engine": saved, "rows": []}
    try:
        for kernel in saved:
            for tile in [saved[kernel]] + [t for t in TILE_SWEEP if t != saved[kernel]]:
                if log.left() < 20:
                    return
                fm.TILES_16BIT[kernel] = dict(tile)
                row: dict = {"kernel": kernel, "tile": dict(tile), "us": {}, "err": 0.0}
                try:
                    for T, (fn, ref) in cases.items():
                        row["err"] = max(row["err"], ml.rel_err(fn(), ref))
                        row["us"][str(T)] = graph_us(fn)
                except Exception as e:          # a shape that does not launch: recorded
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                log.doc["tiles"]["rows"].append(row)
                fm.TILES_16BIT[kernel] = dict(saved[kernel])
    finally:
        fm.TILES_16BIT.clear()
        fm.TILES_16BIT.update(saved)


# -- decode, floor, kernels ------------------------------------------------------------------
def build(kernels: str, layers: int, max_bs: int) -> Engine:
    return Engine(RunConfig(model=MOE, layers=layers, device="cuda", dtype="bfloat16",
                            page_size=16, context_len=512, max_running_requests=max_bs,
                            cuda_graph_max_bs=max_bs, overlap=True, zero_bubble=True,
                            fused=True, moe_kernels=kernels))


def step_p50(eng: Engine, bs: int, tokens: int, seed: int) -> float:
    V = eng.model.config.vocab_size
    eng.generate(prompts(V, bs, PROMPT, seed=100 + seed), max_new_tokens=8, ignore_eos=True)
    eng.generate(prompts(V, bs, PROMPT, seed=seed), max_new_tokens=tokens, ignore_eos=True)
    eng.check_invariants()
    return eng.stats()["decode_step_p50_ms"]


def experts_touched(eng: Engine, bs: int) -> float:
    """Mean distinct experts per MoE layer of one eager decode forward of bs random tokens
    (models/moe.py `recording`; the lanes' rows 1..bs, row 0 is the padded lane's)."""
    dev = eng.device.torch_device
    fn = target_decode_fn(eng, PROMPT)
    g = torch.Generator().manual_seed(bs)
    args = dict(input_ids=torch.randint(3, eng.model.config.vocab_size, (bs,),
                                        generator=g).to(dev),
                rows=torch.arange(1, bs + 1, device=dev),
                kv_lens=torch.full((bs,), PROMPT, device=dev))
    with recording(eng.model) as rec, torch.no_grad():
        fn(**args)
        (per_layer,) = rec.read()
    return statistics.fmean(per_layer)


def free_engines(engines: dict) -> None:
    for e in engines.values():
        e.close()
    engines.clear()
    gc.collect()
    torch.cuda.empty_cache()


def phase_decode(log: Log, a, engines: dict) -> None:
    """Fills `engines` ({kernels: Engine}, kept for the kernels phase), the doc's decode
    steps as they are measured, then the floor of each bs."""
    d = log.doc["decode"]
    runs = {(k, bs): {"kernels": k, "bs": bs, "ms": []} for k in MOE_KERNELS
            for bs in a.batches}
    d["steps"] = list(runs.values())
    max_bs = max(a.batches)
    together = True
    for kernels in MOE_KERNELS:                  # both in memory when they fit
        free_gb = torch.cuda.mem_get_info()[0] / 1e9
        if engines and free_gb < 70:
            together = False
            break
        t0 = time.perf_counter()
        try:
            engines[kernels] = build(kernels, a.layers, max_bs)
        except Exception as e:                   # the second one does not fit: one at a time
            if not engines:
                raise
            d["fallback"] = type(e).__name__
            together = False
            gc.collect()
            torch.cuda.empty_cache()
            break
        d["built"].append({"kernels": kernels, "seconds": round(time.perf_counter() - t0, 1),
                           "free_gb": round(free_gb, 1)})
        if kernels == "grouped":
            d["gemm_plan"] = engines[kernels].gemm_plan
        log.note(f"built the {kernels} engine")
    d["together"] = together
    if together:
        for rep in range(a.repeats):
            for bs in a.batches:
                for kernels in (MOE_KERNELS if rep % 2 == 0 else MOE_KERNELS[::-1]):
                    if log.left() > 30:
                        runs[(kernels, bs)]["ms"].append(
                            step_p50(engines[kernels], bs, a.tokens, rep))
    else:
        for kernels in MOE_KERNELS:
            if kernels not in engines:
                free_engines(engines)
                engines[kernels] = build(kernels, a.layers, max_bs)
            for rep in range(a.repeats):
                for bs in a.batches:
                    if log.left() > 30:
                        runs[(kernels, bs)]["ms"].append(
                            step_p50(engines[kernels], bs, a.tokens, rep))
    eng = engines.get("grouped") or next(iter(engines.values()))
    c = eng.model.config
    for bs in a.batches:
        touched = experts_touched(eng, bs)
        b = step_bytes(c, dtype_bytes=2, bs=bs, context=PROMPT + a.tokens / 2,
                       experts_touched=touched)
        log.doc["floor"].append({"bs": bs, "bytes": float(b.total),
                                 "weight_bytes": float(b.target_weights),
                                 "touched": float(touched),
                                 "uniform": float(expected_experts(c, bs))})


def per_layer_table(full: dict, part: dict, n: int) -> list[tuple[str, float, float]]:
    """(name, count per layer, µs per layer) of the kernels the n extra layers add."""
    rows = []
    for name in set(full) | set(part):
        c = (full.get(name, (0, 0.0))[0] - part.get(name, (0, 0.0))[0]) / n
        us = (full.get(name, (0, 0.0))[1] - part.get(name, (0, 0.0))[1]) / n
        if c > 0:
            rows.append((name, c, us))
    return sorted(rows, key=lambda r: -r[2])


def kernel_table(eng: Engine, kernels: str) -> dict:
    """The kernels of one bs-1 decode forward of `eng` as one graph, per layer and per step.
    Its graphs and their memory pools live only inside this call."""
    L = eng.model.config.num_hidden_layers
    short = L - PERIOD if L > PERIOD else max(1, L // 2)
    dev = eng.device.torch_device
    z = torch.zeros(1, dtype=torch.long, device=dev)
    fn = target_decode_fn(eng, PROMPT)
    args = dict(input_ids=z, rows=z, kv_lens=z + PROMPT)

    def call():
        return fn(**args)

    n_full, full, _, wall = graph_trace(call)
    with depth(eng.model, short):
        n_part, part, _, _ = graph_trace(call)
    how = "as one graph"
    if n_full == 0:                 # a profiler that sees no kernels inside graph replays
        with torch.no_grad():
            n_full, full, _ = gpu_activities(call)
            with depth(eng.model, short):
                n_part, part, _ = gpu_activities(call)
        how = "eager (the trace showed no kernels inside the graph replay)"
    return {
        "kernels": kernels, "how": how, "activities": n_full, "layers": L,
        "span": L - short, "per_layer": (n_full - n_part) / (L - short), "wall_us": wall,
        "busy_us": sum(us for _, us in full.values()),
        "layer": [[n, c, us] for n, c, us in per_layer_table(full, part, L - short)],
        "step": [[n, c, us] for n, (c, us) in
                 sorted(full.items(), key=lambda kv: -kv[1][1])[:STEP_KERNELS]]}


def phase_kernels(log: Log, engines: dict, a) -> None:
    """One kernel table per arm; an arm's engine is built here (the others freed first
    where the device lacks room for both) unless the decode phase left it."""
    for kernels in MOE_KERNELS:
        if kernels not in engines:
            if torch.cuda.mem_get_info()[0] / 1e9 < 70:
                free_engines(engines)
            engines[kernels] = build(kernels, a.layers, 1)
        log.doc["kernels"].append(kernel_table(engines[kernels], kernels))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_moe_floor",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(R.RESULTS),
                    help="the results folder: the report goes into DIR/moe_floor/ "
                         "(default %(default)s)")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--budget-s", type=float, default=400.0)
    ap.add_argument("--only", nargs="+", default=list(study.PHASES[1:]),
                    choices=study.PHASES[1:])
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_moe_floor needs CUDA.", file=sys.stderr)
        return 2
    commit = R.checkout_commit("bench_moe_floor")          # refused before anything runs
    if commit is None:
        return 2
    log = Log(study.new_doc(model=MOE, layers=a.layers, batches=a.batches, repeats=a.repeats,
                            tokens=a.tokens, prompt=PROMPT), a.budget_s)
    log.phase("bandwidth", phase_bandwidth, log, reserve_s=0)
    if "check" in a.only:
        log.phase("check", phase_check, log)
    if "ffn" in a.only:
        log.phase("ffn", phase_ffn, log)
    if "library" in a.only:
        log.phase("library", phase_library, log)
    engines: dict = {}
    if "decode" in a.only:
        log.phase("decode", phase_decode, log, a, engines, reserve_s=120)
    if "kernels" in a.only:
        log.phase("kernels", phase_kernels, log, engines, a, reserve_s=40)
    free_engines(engines)
    if "tiles" in a.only:
        log.phase("tiles", phase_tiles, log, reserve_s=60)
    doc = R.measured_here(log.doc, device="cuda", commit=commit, command=shlex.join(
        ["python", "-m", "benchmarks.bench_moe_floor", *argv]))
    path = R.write(doc, study.render, Path(a.out_dir))
    print(f"report: {path} (results: {path.with_suffix('.json').name})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
