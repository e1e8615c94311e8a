"""Question `moe_floor`: how close an MoE decode step gets to its HBM floor, split vs grouped
MoE kernels (RunConfig `moe_kernels`), and where each microsecond goes.

Runner: moe_floor_runner.py here (entry point benchmarks/bench_moe_floor.py; one process, one
GPU: bandwidth, the grouped kernels against their references, one MoE FFN, the routed experts
beside a library's fused MoE (moe_library.py), the decode step of both arms at each bs and its
floor, the kernels of a graph-captured bs-1 forward, the grouped kernels' launch shapes). It
fills a results doc phase by phase (printing each phase's `section` as it is measured) and
writes the report with `results.write(doc, render)`:

    docs/results/moe_floor/<date>_<device>_<commit>.{json,md}

The results file keeps the measurements (every bandwidth run, every repeat's p50 step, each
FFN timing, the bytes of each floor, the kernel tables); every ratio, noise, floor / step and
verdict is computed from them, so `mtplab report moe_floor` regenerates the report.
"""
from __future__ import annotations

import math
import statistics

from .. import reports as R

QUESTION = "moe_floor"
TITLE = "MoE decode step at the floor: split vs grouped MoE kernels"
WRITER = "python -m benchmarks.bench_moe_floor --out-dir DIR"   # what writes its reports
# floor / step the grouped decode step is held to, per bs
FLOOR_TARGETS = {1: 0.70, 8: 0.70, 32: 0.80}
PHASES = ("bandwidth", "check", "ffn", "library", "decode", "kernels", "tiles")
ARMS = ("split", "grouped")            # models/moe.py MOE_KERNELS; the ratios: split / grouped
NAME = 100                             # kernel names are cut to this many characters


def new_doc(*, model: str, layers: int, batches: list[int], repeats: int, tokens: int,
            prompt: int) -> dict:
    """The results doc a run fills phase by phase; `stamp` adds the stamp at the end."""
    return {"question": QUESTION, "model": model, "layers": layers, "batches": list(batches),
            "repeats": repeats, "tokens": tokens, "prompt": prompt, "phases": {},
            "bandwidth": [], "check": {"cases": [], "graph": {}}, "ffn": [],
            "library": {"name": None, "version": None, "unavailable": None, "rows": []},
            "tiles": {"engine": {}, "rows": []},
            "decode": {"built": [], "together": None, "steps": []}, "floor": [],
            "kernels": []}




# -- figures computed from the doc -----------------------------------------------------------
def _f(v) -> float:
    return math.nan if v is None else float(v)


def spread(xs) -> float:
    """max / min - 1 over the repeats (NaN with fewer than two)."""
    xs = [x for x in xs if x is not None]
    return max(xs) / min(xs) - 1 if len(xs) > 1 and min(xs) > 0 else math.nan


def bandwidth(doc: dict) -> float:
    """The floor's bandwidth (bytes/s): the median of the copy runs (NaN: none)."""
    xs = [x for x in doc["bandwidth"] if x is not None]
    return statistics.median(xs) if xs else math.nan


def _noise(*spreads: float) -> float:
    return max([R.MIN_NOISE] + [s for s in spreads if s == s])


def ratio(a: list, b: list) -> dict:
    """split / grouped of two measurement lists (the medians), its noise (the larger spread,
    at least results.MIN_NOISE), n of each side and the verdict."""
    a, b = [x for x in a if x is not None], [x for x in b if x is not None]
    if not a or not b:
        return {"ratio": math.nan, "noise": math.nan, "n": len(a), "n_base": len(b),
                "verdict": ""}
    r = statistics.median(a) / statistics.median(b)
    noise = _noise(spread(a), spread(b))
    return {"ratio": r, "noise": noise, "n": len(a), "n_base": len(b),
            "verdict": R.verdict(r, noise, len(a), len(b))}


def steps(doc: dict, kernels: str, bs: int) -> list:
    for s in doc["decode"]["steps"]:
        if s["kernels"] == kernels and s["bs"] == bs:
            return s["ms"]
    return []


def floor_ms(doc: dict, f: dict) -> float:
    return 1e3 * f["bytes"] / bandwidth(doc)


def floor_rows(doc: dict) -> list[dict]:
    """Per bs and arm: the step (median of the repeats' p50), its spread, floor / step."""
    out = []
    for f in doc["floor"]:
        for k in ARMS[::-1]:
            xs = [x for x in steps(doc, k, f["bs"]) if x is not None]
            if xs:
                step = statistics.median(xs)
                out.append({"bs": f["bs"], "kernels": k, "step_ms": step, "n": len(xs),
                            "spread": spread(xs), "floor_ms": floor_ms(doc, f),
                            "of_floor": floor_ms(doc, f) / step})
    return out


def step_ratios(doc: dict) -> list[dict]:
    """Per bs: the decode step split / grouped (grouped's speed-up)."""
    return [{"bs": bs, **ratio(steps(doc, "split", bs), steps(doc, "grouped", bs))}
            for bs in doc["batches"] if steps(doc, "split", bs) and steps(doc, "grouped", bs)]


def ffn_ratios(doc: dict) -> list[dict]:
    """Per token count: one MoE FFN's device µs split / grouped."""
    return [{**r, **ratio(r["split_us"], r["grouped_us"])} for r in doc["ffn"]]


def shared_rows_ratios(doc: dict) -> list[dict]:
    """Per token count where measured: the grouped FFN with the shared expert's act rows in
    gate_up / in the routing launch (above 1: the routing launch's rows pay)."""
    return [{**r, **ratio(r["shared_in_gate_up_us"], r["shared_in_route_us"])}
            for r in doc["ffn"] if "shared_in_gate_up_us" in r]


def library_ratios(doc: dict) -> list[dict]:
    """Per token count: the routed experts' device µs library / mtplab (above 1: mtplab's
    grouped kernels are the faster)."""
    return [{**r, **ratio(r["library_us"], r["mtplab_us"])}
            for r in doc.get("library", {}).get("rows", [])]


def _tile_name(t: dict) -> str:
    return f"{t['BLOCK_N']}/{t['BLOCK_K']}/{t['num_warps']}/{t['num_stages']}"


def tile_rows(doc: dict) -> dict[str, list[dict]]:
    """Per grouped kernel: each launch shape timed (µs per T, their sum over the token
    counts), the engine's first, the others fastest first; vs_engine = the engine's summed
    µs / this shape's (> 1: faster); a shape that did not launch last, with its error."""
    out: dict[str, list[dict]] = {}
    t = doc.get("tiles") or {}
    for kernel, engine in t.get("engine", {}).items():
        rows = [{**r, "name": _tile_name(r["tile"]), "engine": r["tile"] == engine,
                 "sum": sum(r["us"].values()) if "error" not in r else math.nan}
                for r in t["rows"] if r["kernel"] == kernel]
        base = next((r["sum"] for r in rows if r["engine"]), math.nan)
        for r in rows:
            r["vs_engine"] = base / r["sum"] if r["sum"] == r["sum"] else math.nan
        out[kernel] = sorted(rows, key=lambda r: (not r["engine"], r["sum"] != r["sum"],
                                                   r["sum"] if r["sum"] == r["sum"] else 0))
    return out


def _rt(r: dict) -> str:
    return R.ratio_text(r["ratio"], r["noise"], r["verdict"])


def _said(r: dict) -> str:
    """'1.120x ±2.0% (pays)'."""
    return _rt(r).replace(", ", " (", 1) + ")"


# -- sections ----------------------------------------------------------------------------------
def _status(doc: dict, name: str) -> list[str]:
    p = doc["phases"].get(name)
    if p is None:
        return ["- not run (--only)"]
    if p["status"] == "skipped":
        return [f"- SKIPPED (time box: {p['left_s']:.0f} s left)"]
    if p["status"] == "error":
        return [f"- ERROR {p['error']}"]
    return [f"- done in {p['seconds']:.1f} s"]


def _bandwidth(doc: dict) -> list[str]:
    xs = [x for x in doc["bandwidth"] if x is not None]
    if not xs:
        return []
    return [f"- copy bandwidth {bandwidth(doc) / 1e12:.3f} TB/s (median of {len(xs)} runs, "
            f"spread {R.num(spread(xs), '.1%')}): the floor's bandwidth"]


def _check(doc: dict) -> list[str]:
    out = []
    for c in doc["check"]["cases"]:
        out.append(f"- T={c['T']}: {'OK' if c['ok'] else 'FAIL'} (ids equal on {c['clear']}/"
                   f"{c['T']} clear rows: {c['same_ids']}; max |dw| {R.num(c['dw'], '.1e')}; max "
                   f"|dgate| {R.num(c['dg'], '.1e')}; alignment == torch align: "
                   f"{c['aligned']}; FFN max err / max |ref| {R.num(c['err'], '.1e')}; "
                   f"counters zero: {c['counters_zero']})")
    g = doc["check"]["graph"]
    if g:
        out.append(f"- batch-invariant row: {g['batch_invariant']}; graph replays == eager: "
                   f"{g['graph_eq_eager']}; counters zero after: {g['counters_zero']}")
    return out


def _ffn(doc: dict) -> list[str]:
    fr = ffn_ratios(doc)
    routed = bool(fr) and all("route" in r for r in fr)
    rows = [[str(r["T"]), f"{statistics.median(r['split_us']):.1f}", str(r["split_kernels"]),
             f"{statistics.median(r['grouped_us']):.1f}", str(r["grouped_kernels"]), _rt(r),
             f"{r['n']}/{r['n_base']}"] + (_route_cells(r) if routed else []) for r in fr]
    if not rows:
        return []
    head = ["tokens", "split µs", "split kernels", "grouped µs", "grouped kernels",
            "split / grouped", "n"]
    text = ("One gemma MoE FFN layer (bf16, random weights), the call captured 20x in a CUDA "
            "graph: device µs per call (median of the captures' medians), kernels per call.")
    if routed:
        warps = " / ".join(str(v["warps"]) for v in fr[0]["route"])
        head += [f"routing kernel µs at {warps} warps (spread)", "its serial work"]
        text += (" The grouped arm's routing kernel alone, the same way, at each number of "
                 "warps a program; its serial work (kernels/moe_route.py serial_work): "
                 "programs, arrival phases, the aligning program's loop trips.")
    out = [text, "", R.md_table(head, rows)]
    sr = shared_rows_ratios(doc)
    if sr:
        out += ["", "The grouped FFN with the shared expert's act rows computed by the gate_up "
                "kernel beside the engine's (by extra programs of the routing launch), the "
                "captures alternating:", "",
                R.md_table(["tokens", "rows in gate_up µs", "rows in the routing launch µs",
                            "gate_up / routing launch", "n"],
                           [[str(r["T"]), f"{statistics.median(r['shared_in_gate_up_us']):.1f}",
                             f"{statistics.median(r['shared_in_route_us']):.1f}", _rt(r),
                             f"{r['n']}/{r['n_base']}"] for r in sr])]
    return out


def _route_cells(r: dict) -> list[str]:
    w = r["route_work"]
    return [" / ".join(f"{statistics.median(v['us']):.1f} ({R.num(spread(v['us']), '.0%')})"
                       for v in r["route"]),
            f"programs {w['programs']}, phases {w['phases']}, aligning trips {w['align_trips']}"]


def _library(doc: dict) -> list[str]:
    lib = doc["library"]
    if lib["unavailable"]:
        return [f"- not measured: {lib['unavailable']}"]
    lr = library_ratios(doc)
    if not lr:
        return []
    own = all("library_own_err" in r for r in lr)     # the own-routing columns were measured
    name, who = f"{lib['name']} {lib['version']}", lib["name"]
    rows = [[str(r["T"]), f"{statistics.median(r['mtplab_us']):.1f}", str(r["mtplab_kernels"]),
             f"{statistics.median(r['library_us']):.1f}", str(r["library_kernels"]), _rt(r),
             f"{r['n']}/{r['n_base']}", R.num(r["mtplab_err"], ".1e"),
             R.num(r["library_err"], ".1e")]
            + ([R.num(r["mtplab_own_err"], ".1e"), R.num(r["library_own_err"], ".1e"),
                f"{r['mtplab_rerouted']} / {r['library_rerouted']}"] if own else [])
            for r in lr]
    head = ["tokens", "mtplab µs", "mtplab kernels", f"{who} µs", f"{who} kernels",
            f"{who} / mtplab", "n", "mtplab err", f"{who} err"]
    if own:
        head += ["mtplab err (own routing)", f"{who} err (own routing)",
                 f"tokens rerouted (mtplab / {who})"]
    return [f"The routed experts of one gemma MoE layer (bf16, random weights, no shared "
            f"expert) from the layer's input, mtplab's grouped kernels beside {name}'s fused "
            f"MoE (studies/moe/moe_library.py: router, top-k, alignment, gate/up, down, "
            f"combine), the arms' captures alternating: device µs per call (each call "
            f"captured 20x in a CUDA graph, median of the captures' medians), kernels per "
            f"call, and each output's max |err| / max |ref| against the torch reference, "
            f"which routes on fp32 router logits as mtplab's router does; {who}'s arm routes "
            f"on logits in the model dtype, as {who} serves, so a token whose k-th and "
            f"(k+1)-th experts are near-tied may take another expert and differ by a "
            f"fraction of max |ref|."
            + (" *Own routing*: against the reference FFN on the arm's own routing (its "
               "expert kernels alone); *tokens rerouted*: tokens whose experts differ from "
               "the reference's." if own else ""), "",
            R.md_table(head, rows)]


def _tiles(doc: dict) -> list[str]:
    out = []
    for kernel, rows in tile_rows(doc).items():
        if not rows:
            continue
        Ts = list(next((r["us"] for r in rows if "error" not in r), {}))
        out += [f"The grouped FFN (gemma widths, bf16, shared expert folded in) with the "
                f"{kernel} kernel's launch shape (BLOCK_N / BLOCK_K / warps / stages) replaced, "
                f"device µs per call; *vs engine*: the engine's summed µs / this shape's "
                f"(> 1: faster); *err*: max |err| / max |ref| over the token counts.", "",
                R.md_table(["kernel", "launch shape", *(f"µs T={T}" for T in Ts), "sum",
                            "vs engine", "err"],
                           [[kernel, r["name"] + (" (engine)" if r["engine"] else ""),
                             *(f"{r['us'][T]:.1f}" if "error" not in r else "-" for T in Ts),
                             R.num(r["sum"], ".1f"), R.num(r["vs_engine"], ".3f"),
                             r.get("error") or R.num(r["err"], ".1e")] for r in rows]), ""]
    return out[:-1]


def _decode(doc: dict) -> list[str]:
    d = doc["decode"]
    out = [f"- built the {b['kernels']} engine in {b['seconds']:.0f} s ({b['free_gb']:.0f} GB "
           "free before)" for b in d["built"]]
    if d.get("fallback"):
        out.append(f"- the second engine did not build ({d['fallback']}); the arms ran one "
                   "after the other")
    if d["together"] is not None:
        how = "together, arms interleaved" if d["together"] else "one after the other"
        out.append(f"- engines {how}; {doc['repeats']} repeats of {doc['tokens']} new tokens "
                   f"after {doc['prompt']}-token prompts")
    rows = [[str(r["bs"]), r["kernels"], f"{r['step_ms']:.3f}", R.num(r["spread"], ".1%"),
             str(r["n"]), f"{r['floor_ms']:.3f}", f"{r['of_floor']:.3f}"]
            for r in floor_rows(doc)]
    if rows:
        out += ["", R.md_table(["bs", "arm", "step p50 ms", "spread", "n", "floor ms",
                                "floor / step"], rows)]
    floors = [[str(f["bs"]), f"{f['bytes'] / 1e9:.2f}", f"{f['weight_bytes'] / 1e9:.2f}",
               f"{f['touched']:.1f}", f"{f['uniform']:.1f}", f"{floor_ms(doc, f):.3f}"]
              for f in doc["floor"]]
    if floors:
        out += ["", "The floor: the bytes one step reads (models/floor.py step_bytes: every "
                "parameter once, the tied embedding as the LM head, per MoE layer the experts "
                "bs random tokens touch, counted on one eager forward; the KV in context) / "
                "the bandwidth.", "",
                R.md_table(["bs", "GB per step", "GB weights", "experts / layer (measured)",
                            "experts / layer (uniform)", "floor ms"], floors)]
    ratios = [[str(r["bs"]), _rt(r), f"{r['n']}/{r['n_base']}"] for r in step_ratios(doc)]
    if ratios:
        out += ["", R.md_table(["bs", "decode step split / grouped", "n"], ratios)]
    plan = d.get("gemm_plan")
    if plan:
        out += ["", "The grouped engine's decode GEMM plan (RunConfig decode_gemm, "
                "models/gemm_plan.py: µs summed over GEMMs of 1 and 8 rows; Triton kept where "
                "it wins by 2%):", "",
                R.md_table(["N x K", "sites", "cuBLAS µs", "fastest Triton µs", "kept"],
                           [[R.plan_shape(p), str(p["sites"]),
                             R.num(p["cublas_us"], ".1f"), R.num(p["triton_us"], ".1f"),
                             p["launch"] or "cuBLAS"] for p in plan])]
    return out


def _kernel_table(k: dict, scope: str, rows: list) -> str:
    total = sum(r[2] for r in rows) or 1.0
    fmt = ".2f" if scope == "layer" else "d"
    return R.md_table(["arm, scope", "kernel", "count", "µs", "share"],
                      [[f"{k['kernels']} {scope}", name[:NAME], format(c, fmt), f"{us:.1f}",
                        f"{us / total:.1%}"] for name, c, us in rows])


def _kernels(doc: dict) -> list[str]:
    out = []
    for k in doc["kernels"]:
        busy = k["busy_us"]
        layer_us = sum(r[2] for r in k["layer"])
        out += [f"- {k['kernels']}: bs-1 decode forward {k['how']}: {k['activities']} GPU "
                f"activities, {k['per_layer']:.1f} per decoder layer "
                f"({k['activities'] - k['layers'] * k['per_layer']:.0f} outside the layers); "
                f"replay {k['wall_us']:.0f} µs, kernels busy {busy:.0f} µs, gaps "
                f"{k['wall_us'] - busy:.0f} µs",
                f"- {k['kernels']}: one decoder layer (mean of a {k['span']}-layer span): "
                f"{sum(r[1] for r in k['layer']):.1f} kernels, {layer_us:.1f} µs", "",
                _kernel_table(k, "layer", k["layer"]), "",
                f"The whole step's {len(k['step'])} busiest kernels (share of the kernels' "
                f"busy {busy:.0f} µs):", "",
                R.md_table(["arm, scope", "kernel", "count", "µs", "share"],
                           [[f"{k['kernels']} step", n[:NAME], str(c), f"{us:.1f}",
                             f"{us / (busy or 1.0):.1%}"] for n, c, us in k["step"]]), ""]
    return out[:-1] if out else out


SECTIONS = {"bandwidth": _bandwidth, "check": _check, "ffn": _ffn, "library": _library,
            "decode": _decode, "kernels": _kernels, "tiles": _tiles}


def section(doc: dict, name: str) -> str:
    """One phase's part of the report (its figures, then how the phase ended)."""
    body = SECTIONS[name](doc)
    return "\n".join([f"## {name}", "", *body, *([""] if body else []), *_status(doc, name)])


def _target(r: dict) -> str:
    """' (target >= t: met / MISS)' where the bs has a target."""
    t = FLOOR_TARGETS.get(r["bs"])
    return "" if t is None else \
        f" (target >= {t:.2f}: {'met' if r['of_floor'] >= t else 'MISS'})"


def answer(doc: dict) -> str:
    parts = []
    sr = step_ratios(doc)
    if sr:
        parts.append("decode step time split / grouped (above 1: the grouped MoE kernels "
                     "pay) " + ", ".join(f"{_said(r)} at bs {r['bs']}" for r in sr))
    fl = [r for r in floor_rows(doc) if r["kernels"] == "grouped"]
    if fl:
        parts.append("grouped reaches floor / step " + ", ".join(
            f"{r['of_floor']:.3f} at bs {r['bs']}" + _target(r) for r in fl))
    fr = ffn_ratios(doc)
    if fr:
        parts.append("one MoE FFN split / grouped " + ", ".join(
            f"{_said(r)} at T={r['T']}" for r in fr))
    sr = shared_rows_ratios(doc)
    if sr:
        parts.append("the grouped FFN with the shared rows in gate_up / in the routing launch "
                     + ", ".join(f"{_said(r)} at T={r['T']}" for r in sr))
    lib = doc.get("library", {})
    lr = library_ratios(doc)
    if lr:
        parts.append(f"the routed experts {lib['name']} {lib['version']} / mtplab (above 1: "
                     f"mtplab's kernels are the faster) " + ", ".join(
                         f"{_said(r)} at T={r['T']}" for r in lr))
    elif lib.get("unavailable"):
        parts.append("no library MoE kernel measured (it did not import)")
    best = {k: next((r for r in rows[1:] if r["sum"] == r["sum"]), None)
            for k, rows in tile_rows(doc).items() if rows and rows[0]["engine"]}
    if any(best.values()):
        parts.append("the fastest other launch shape of the grouped kernels " + ", ".join(
            f"{k} {r['name']} {r['vs_engine']:.3f}x the engine's" for k, r in best.items()
            if r))
    cases = doc["check"]["cases"]
    if cases:
        parts.append(f"the grouped kernels match their references at {sum(c['ok'] for c in cases)}"
                     f" of {len(cases)} token counts")
    failed = [n for n, p in doc["phases"].items() if p["status"] != "done"]
    if failed:
        parts.append("not measured: " + ", ".join(f"{n} ({doc['phases'][n]['status']})"
                                                   for n in failed))
    return ("; ".join(parts) or "nothing measured") + "."


def render(doc: dict) -> str:
    """The report: its stamp, the answer, then each phase's section."""
    parts = [R.header(doc, f"{TITLE} ({doc['model']}@{doc['layers']})"),
             f"- noise: a step's spread is max / min - 1 over the repeats' p50 steps (an FFN "
             f"timing's over its captures); a ratio's noise the larger of its two sides' "
             f"spreads, at least {R.MIN_NOISE:.0%}", ""]
    parts += R.note_and_answer(doc, answer(doc))
    for name in PHASES:
        if name in doc["phases"]:
            parts += ["", section(doc, name)]
    return "\n".join(parts) + "\n"
