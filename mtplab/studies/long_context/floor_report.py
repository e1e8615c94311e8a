"""The dense-floor report of question `long_context`: how close a decode step is to its HBM
floor from 64-token prompts to 32k, what a speculative step costs beside a target step, and,
for a missed target, where each microsecond of the step goes.

Runner: benchmarks/bench_long_context.py --out-dir DIR (studies/long_context/floor_runner.py)
writes `DIR/long_context/<YYYY-MM-DD>_<device>_<commit>.{json,md}`. The results file keeps
the measurements; every ratio, noise and verdict below is computed from them, so `mtplab
report long_context` regenerates the report byte for byte. Its fields:

    kind        "dense_floor" (the question's other reports are sweep groups, studies/group.py)
    bandwidth   the device copy bandwidth (bytes/s) of each copy run, measured in the run's
                process: the floor's bandwidth is their median
    steps       per (figure, model, arm, ctx, bs): `ms`, the p50 decode step of each window
                (consecutive windows of one generate's decode steps: the KV is prefilled once
                per cell), and the floor's bytes: weights read + the KV of the mean context
                (models/floor.py: a floor counts only the bytes a step reads)
    kernels     per profiled cell: every GPU activity of `steps` decode steps in launch order
                ([name, µs]), the layers, the bytes of each projection's weights
    gemm_plan   per model of the short figure: Engine.gemm_plan (models/gemm_plan.py), each
                weight shape's cuBLAS and fastest Triton µs and the launch chosen (its cells'
                arm CUBLAS_ARM ran the same model with decode_gemm="cublas", side by side)
    figures     per figure: done / skipped (time box) / error
"""
from __future__ import annotations

import math
import re
import statistics
from typing import Optional

from ...errors import ConfigError
from .. import reports as R

QUESTION = "long_context"
KIND = "dense_floor"
TITLE = "Dense decode at the HBM floor, 64 tokens to 32k; the speculative step beside it"
WRITER = "python -m benchmarks.bench_long_context --out-dir DIR"
FLOOR_TARGET = 0.85                      # floor / step, short and long context
SPEC_TARGETS = {1: 1.25, 4: 1.4}         # spec step / target step at 32k, per topk
SPEC_CTX = 32768                          # the context the spec targets hold at
SHORT_CTX = 64
CUBLAS_ARM = "target, decode_gemm=cublas"   # the short figure's side-by-side arm
PROJ = ("qkv", "o_proj", "gate_up", "down")     # a decoder layer's GEMMs, launch order
LM_HEAD = "lm_head"
KINDS = ("gemm", "attention", "norm_rope_elementwise", "fill_copy", "other")
KIND_TEXT = {"gemm": "GEMMs", "attention": "attention", "fill_copy": "fills / copies",
             "norm_rope_elementwise": "norms / rope / elementwise", "other": "other "
             "(sampling, accept, tree)"}
NAME = 90                                  # kernel names are cut to this many characters
# Kernel names by kind, tried in this order (a fill's name also holds "elementwise").
_FILL = re.compile(r"fill|memset|memcpy|zero|copy", re.I)
_ATTN = re.compile(r"attn|attention|flash|fmha|^_split_kernel|^_split_reduce_kernel|"
                   r"^_extend_kernel|^_det_kernel", re.I)
_GEMM_TAIL = re.compile(r"splitkreduce|reduce_kernel<.*cublas", re.I)  # a split-K GEMM's end
_GEMM = re.compile(r"gemm|gemv|nvjet|xmma|cutlass|cublas|_mm_kernel|matmul", re.I)
_NORM = re.compile(r"norm|rope|rotary|silu|gelu|elementwise|vectorized|_mul_|add", re.I)


def kind_of(name: str) -> str:
    """The kind of a GPU activity (KINDS) by its name."""
    if _FILL.search(name):
        return "fill_copy"
    if _ATTN.search(name):
        return "attention"
    if _GEMM.search(name) or _GEMM_TAIL.search(name):
        return "gemm"
    if _NORM.search(name):
        return "norm_rope_elementwise"
    return "other"


def label_kernels(kernels: list, layers: int, steps: int) -> list[tuple[str, str, float]]:
    """(name, label, µs) of each activity: its kind, a GEMM its projection. A target step
    launches 4 GEMMs per decoder layer (PROJ, in order) then the LM head; a split-K reduce
    belongs to the GEMM before it. When the GEMM count is not steps x (4 x layers + 1) (a
    speculative step: the draft's GEMMs too) a GEMM is labelled `gemm`."""
    gemms = [i for i, (n, _) in enumerate(kernels)
             if kind_of(n) == "gemm" and not _GEMM_TAIL.search(n)]
    per_step = len(PROJ) * layers + 1
    assign = len(gemms) == steps * per_step and layers > 0
    out, g = [], -1
    for n, us in kernels:
        k = kind_of(n)
        if k == "gemm":
            if not _GEMM_TAIL.search(n):
                g += 1
            j = g % per_step if g >= 0 else 0
            k = (LM_HEAD if j == per_step - 1 else PROJ[j % len(PROJ)]) if assign else "gemm"
            k = f"gemm {k}" if assign else k
        out.append((n, k, float(us)))
    return out


# -- figures computed from the doc -----------------------------------------------------------
def spread(xs) -> float:
    """max / min - 1 over the windows (NaN with fewer than two)."""
    xs = [x for x in xs if x is not None]
    return max(xs) / min(xs) - 1 if len(xs) > 1 and min(xs) > 0 else math.nan


def noise(*spreads: float) -> float:
    return max([R.MIN_NOISE] + [s for s in spreads if s == s])


def bandwidth(doc: dict) -> float:
    xs = [x for x in doc["bandwidth"] if x is not None]
    return statistics.median(xs) if xs else math.nan


def _ms(s: dict) -> list:
    return [x for x in s["ms"] if x is not None]


def floor_ms(doc: dict, s: dict) -> float:
    return 1e3 * s["floor_bytes"] / bandwidth(doc)


def target_of(s: dict) -> str:
    return "short" if s["ctx"] <= SHORT_CTX else "long"


def floor_rows(doc: dict) -> list[dict]:
    """Per target-only cell with steps: step (median of the windows), spread, floor / step
    with its noise, against FLOOR_TARGET."""
    out = []
    for s in doc["steps"]:
        xs = _ms(s)
        if s["arm"] != "target" or not xs:
            continue
        step = statistics.median(xs)
        r = floor_ms(doc, s) / step
        out.append({**s, "step_ms": step, "n": len(xs), "spread": spread(xs),
                    "floor_ms": floor_ms(doc, s), "ratio": r, "noise": noise(spread(xs)),
                    "target": FLOOR_TARGET, "ok": r >= FLOOR_TARGET})
    return out


def _target_step(doc: dict, s: dict) -> Optional[dict]:
    for t in doc["steps"]:
        if (t["arm"] == "target" and t["model"] == s["model"] and t["ctx"] == s["ctx"]
                and t["bs"] == s["bs"] and _ms(t)):
            return t
    return None


def spec_rows(doc: dict) -> list[dict]:
    """Per speculative cell with a target-only step at its model, ctx and bs: spec step /
    target step (medians), its noise, the target at SPEC_CTX, and `floors`: the spec floor /
    the target's (the ratio if both steps ran at their floors)."""
    out = []
    for s in doc["steps"]:
        t = (_target_step(doc, s) if s["arm"] not in ("target", CUBLAS_ARM) and _ms(s)
             else None)
        if t is None:
            continue
        a, b = statistics.median(_ms(s)), statistics.median(_ms(t))
        fa, fb = floor_ms(doc, s), floor_ms(doc, t)
        r = a / b
        target = SPEC_TARGETS.get(s.get("topk")) if s["ctx"] == SPEC_CTX else None
        out.append({**s, "spec_ms": a, "target_ms": b, "ratio": r, "n": len(_ms(s)),
                    "n_base": len(_ms(t)), "noise": noise(spread(_ms(s)), spread(_ms(t))),
                    "target": target, "ok": None if target is None else r <= target,
                    "floor_ms": fa, "target_floor_ms": fb, "floors": fa / fb})
    return out


def plan_rows(doc: dict) -> list[dict]:
    """Per CUBLAS_ARM cell with its target-only twin: cuBLAS step / planned step (> 1: the
    plan is faster), its noise and verdict."""
    out = []
    for s in doc["steps"]:
        t = _target_step(doc, s) if s["arm"] == CUBLAS_ARM and _ms(s) else None
        if t is None:
            continue
        a, b = statistics.median(_ms(s)), statistics.median(_ms(t))
        nz = noise(spread(_ms(s)), spread(_ms(t)))
        out.append({"model": s["model"], "ctx": s["ctx"], "bs": s["bs"], "cublas_ms": a,
                    "plan_ms": b, "ratio": a / b, "noise": nz,
                    "words": R.verdict(a / b, nz, len(_ms(s)), len(_ms(t)))})
    return out


def verdict(r: dict) -> str:
    """PASS / MISS against the row's target ('-' without one), 'within the noise' when the
    target lies inside ratio x (1 +- noise), 'one window' when there is no spread."""
    if r["target"] is None:
        return "-"
    v = "PASS" if r["ok"] else "MISS"
    if min(r["n"], r.get("n_base", r["n"])) < 2:
        return f"{v} (one window, no noise)"
    if abs(r["ratio"] - r["target"]) <= r["noise"] * r["ratio"]:
        return f"{v} (within the noise)"
    return v


def _key(r: dict) -> tuple:
    return (r["model"], r["arm"], r.get("topk"), r["ctx"], r["bs"])


def breakdown(doc: dict, k: dict) -> dict:
    """Where one step of a profiled cell goes: {label: (activities per step, µs per step)},
    the busy µs per step, the step (the cell's median window p50) and the gaps (step - busy)."""
    steps = k["steps"]
    by: dict = {}
    for _, label, us in label_kernels(k["kernels"], k["layers"], steps):
        c, t = by.get(label, (0, 0.0))
        by[label] = (c + 1, t + us)
    by = {lab: (c / steps, t / steps) for lab, (c, t) in by.items()}
    busy = sum(t for _, t in by.values())
    cell = next((s for s in doc["steps"] if _key(s) == _key(k) and _ms(s)), None)
    step_us = 1e3 * statistics.median(_ms(cell)) if cell else math.nan
    return {"labels": by, "busy_us": busy, "step_us": step_us, "gaps_us": step_us - busy}


def _order(label: str) -> tuple:
    kind = label.split(" ")[0]
    proj = label.split(" ", 1)[1] if " " in label else ""
    return (KINDS.index(kind) if kind in KINDS else len(KINDS),
            (PROJ + (LM_HEAD,)).index(proj) if proj in PROJ + (LM_HEAD,) else 9)


def breakdown_lines(doc: dict, k: dict) -> list[str]:
    """The table of where each microsecond of the cell's step goes, GEMMs by projection
    with the share of copy bandwidth their weights are read at."""
    b = breakdown(doc, k)
    bw = bandwidth(doc)
    step = b["step_us"]
    rows = []
    for lab in sorted(b["labels"], key=_order):
        c, us = b["labels"][lab]
        kind, _, proj = lab.partition(" ")
        gb = k.get("proj_bytes", {}).get(proj)
        at = (f"{gb / 1e9:.3f} GB, {gb / (us * 1e-6) / bw:.2f}" if gb and us > 0 else "-")
        rows.append([KIND_TEXT.get(kind, kind) + (f" {proj}" if proj else ""),
                     f"{c:.0f}", f"{us:.1f}", R.num(us / step, ".1%"), at])
    rows.append(["gaps (step - kernels busy)", "-", R.num(b["gaps_us"], ".1f"),
                 R.num(b["gaps_us"] / step, ".1%"), "-"])
    blind = len(k["kernels"]) < k["layers"] * k["steps"]
    return [f"{k['label']} (ctx {k['ctx']}, bs {k['bs']}): one step {R.num(step, '.0f')} µs "
            f"(the cell's median window p50), kernels busy {b['busy_us']:.0f} µs; "
            f"{len(k['kernels'])} activities over {k['steps']} profiled steps"
            + (", fewer than one per layer: the profiler saw no kernels inside the graph "
               "replays, and this table is not the step's." if blind else "."), "",
            R.md_table(["where", "activities / step", "µs / step", "share of step",
                        "weights read, share of copy bandwidth"], rows)]


def _labels_text(labels: list[str]) -> str:
    """One kernel's labels in launch order: "gemm qkv, o_proj, down" when they share a kind."""
    kinds = {lab.split(" ", 1)[0] for lab in labels}
    if len(labels) > 1 and len(kinds) == 1 and all(" " in lab for lab in labels):
        return f"{kinds.pop()} " + ", ".join(lab.split(" ", 1)[1] for lab in labels)
    return ", ".join(labels)


def top_kernels(k: dict, n: int = 12) -> list[str]:
    """The n kernels of most µs: each with every label it ran under (one kernel can serve
    several projections)."""
    by: dict = {}
    for name, label, us in label_kernels(k["kernels"], k["layers"], k["steps"]):
        c, t, labs = by.get(name, (0, 0.0, []))
        by[name] = (c + 1, t + us, labs + [label] if label not in labs else labs)
    total = sum(t for _, t, _ in by.values()) or 1.0
    rows = [[name[:NAME], _labels_text(labs), f"{c / k['steps']:.0f}",
             f"{t / k['steps']:.1f}", f"{t / total:.1%}"] for name, (c, t, labs) in
            sorted(by.items(), key=lambda kv: -kv[1][1])[:n]]
    return [R.md_table(["kernel", "label", "count / step", "µs / step", "share"], rows)]


# -- the report ------------------------------------------------------------------------------
def _ratio(r: dict) -> str:
    return f"{r['ratio']:.3f} ±{r['noise']:.1%}"


def _floors_text(r: dict) -> str:
    """A spec row's floors beside its steps: how much of its miss the bytes alone make."""
    return (f"At their floors the spec step takes {r['floor_ms']:.3f} ms and the target step "
            f"{r['target_floor_ms']:.3f} ms: {r['floors']:.3f}x from the bytes alone, against "
            f"the target <= {r['target']}. The spec step runs at "
            f"{r['floor_ms'] / r['spec_ms']:.3f} of its floor, the target step at "
            f"{r['target_floor_ms'] / r['target_ms']:.3f} of its.")


def _where(doc: dict, r: dict) -> Optional[dict]:
    return next((k for k in doc["kernels"] if _key(k) == _key(r)), None)


def answer(doc: dict) -> str:
    parts = []
    fr = floor_rows(doc)
    if fr:
        parts.append("floor / step (target >= {:.2f}) ".format(FLOOR_TARGET) + ", ".join(
            f"{_ratio(r)} {verdict(r).split(' ')[0]} at {r['model']} ctx {r['ctx']} bs "
            f"{r['bs']}" for r in fr))
    sr = [r for r in spec_rows(doc) if r["target"] is not None]
    if sr:
        parts.append("spec step / target step at 32k " + ", ".join(
            f"{_ratio(r)} {verdict(r).split(' ')[0]} (<= {r['target']}; floors "
            f"{r['floors']:.3f}) for topk "
            f"{r['topk']}{' ' + r['draft_vocab'] if r.get('draft_vocab') else ''}"
            f"{' kv window ' + str(r['draft_kv_window']) if r.get('draft_kv_window') else ''}"
            f" bs {r['bs']}"
            for r in sr))
    pr = plan_rows(doc)
    if pr:
        parts.append("the engine's GEMM plan against cuBLAS (step / step) " + ", ".join(
            f"{R.ratio_text(r['ratio'], r['noise'], r['words'])} at {r['model']} bs {r['bs']}"
            for r in pr))
    gr = gemm_rows(doc)
    if gr:
        faster = [f"{r['shape']} M={r['M']}" for r in gr if r["words"] == R.PAYS]
        parts.append(f"decode GEMMs: the Triton GEMM beats cuBLAS beyond the noise on "
                     f"{len(faster)} of {len(gr)}" + (f" ({', '.join(faster)})" if faster
                                                       else ""))
    ar = [r for r in attn_rows(doc) if r["queries"] > 1 and r["vs_decode"] == r["vs_decode"]]
    if ar:
        parts.append("verify attention per layer at 32k / a decode's " + ", ".join(
            f"{r['vs_decode']:.2f}x ({r['queries']} nodes, bs {r['bs']})" for r in ar))
    bad = [n for n, f in doc["figures"].items() if f["status"] != "done"]
    if bad:
        parts.append("not measured: " + ", ".join(f"{n} ({doc['figures'][n]['status']})"
                                                   for n in bad))
    return ("; ".join(parts) or "nothing measured") + "."


def gemm_rows(doc: dict) -> list[dict]:
    """Per decode GEMM (shape, M) of the `gemm` figure: cuBLAS, config()'s Triton pick and the
    fastest Triton launch shape, each its median µs and floor / µs; cuBLAS µs / the fastest
    Triton's (> 1: Triton faster), its noise (the larger spread of the two) and verdict."""
    out = []
    for c in doc.get("gemm") or []:
        arms = {k: (statistics.median(a["us"]), spread(a["us"]), len(a["us"]))
                for k, a in c["arms"].items()}
        best = min((k for k in arms if k != "cublas"), key=lambda k: arms[k][0])
        (cub, s_c, n_c), (tri, s_t, n_t) = arms["cublas"], arms[best]
        r, nz = cub / tri, noise(s_c, s_t)
        out.append({"shape": c["shape"], "N": c["N"], "K": c["K"], "M": c["M"],
                    "floor_us": c["floor_us"], "cublas_us": cub, "pick_us": arms["triton"][0],
                    "best": best, "best_us": tri, "ratio": r, "noise": nz,
                    "words": R.verdict(r, nz, n_c, n_t)})
    return out


def _gemm_lines(doc: dict) -> list[str]:
    rows = gemm_rows(doc)
    if not rows:
        return []
    lines = ["", "## Decode GEMMs: cuBLAS beside the Triton GEMM", "",
             "llama3-8b-like's decode GEMMs over rotating weights (no L2 hits), each arm's "
             "median device µs per call over the repeats and its floor / µs (the weight's bytes "
             "at the copy bandwidth); *Triton pick*: kernels/gemv.py config()'s launch shape; "
             "*fastest Triton*: the fastest of every launch shape measured; cuBLAS / fastest "
             "(> 1: the Triton GEMM is faster) ± the noise, its verdict.", ""]
    lines.append(R.md_table(
        ["M", "GEMM", "N x K", "floor µs", "cuBLAS µs (floor / µs)", "Triton pick µs",
         "fastest Triton", "cuBLAS / fastest"],
        [[str(r["M"]), r["shape"], f"{r['N']} x {r['K']}", f"{r['floor_us']:.1f}",
          f"{r['cublas_us']:.1f} ({r['floor_us'] / r['cublas_us']:.3f})", f"{r['pick_us']:.1f}",
          f"{r['best']}: {r['best_us']:.1f} ({r['floor_us'] / r['best_us']:.3f})",
          R.ratio_text(r["ratio"], r["noise"], r["words"])] for r in rows]))
    for m in sorted({r["M"] for r in rows}):
        sel = [r for r in rows if r["M"] == m]
        cub = sum(r["cublas_us"] for r in sel)
        best = sum(min(r["cublas_us"], r["best_us"]) for r in sel)
        lines.append(f"- M = {m}: the {len(sel)} GEMMs once each take {cub:.1f} µs on cuBLAS, "
                     f"{best:.1f} µs with the faster arm per GEMM ({best / cub - 1:+.1%})")
    return lines


def _plan_lines(doc: dict) -> list[str]:
    rows, plans = plan_rows(doc), doc.get("gemm_plan") or {}
    if not rows and not plans:
        return []
    lines = ["", "## The engine's decode GEMM plan beside cuBLAS", "",
             "RunConfig decode_gemm (models/gemm_plan.py): at engine build each weight shape's "
             "GEMMs of 1 and 8 rows run on cuBLAS and on each candidate launch of the skinny "
             "Triton GEMM (µs summed over the two row counts, weights in rotation); the faster "
             "is kept, Triton only where it wins by 2%. The short figure runs each cell on "
             "that engine and on one with decode_gemm=cublas, side by side in one process.", ""]
    if rows:
        lines.append(R.md_table(
            ["model", "ctx", "bs", "cuBLAS step ms", "planned step ms", "cuBLAS / planned"],
            [[r["model"], str(r["ctx"]), str(r["bs"]), f"{r['cublas_ms']:.3f}",
              f"{r['plan_ms']:.3f}", R.ratio_text(r["ratio"], r["noise"], r["words"])]
             for r in rows]))
    for model, plan in plans.items():
        lines += ["", f"{model}'s plan:", "", R.md_table(
            ["model", "N x K", "sites", "cuBLAS µs", "fastest Triton µs", "kept"],
            [[p["model"], R.plan_shape(p), str(p["sites"]), R.num(p["cublas_us"], ".1f"),
              R.num(p["triton_us"], ".1f"), p["launch"] or "cuBLAS"] for p in plan])]
    return lines


def attn_rows(doc: dict) -> list[dict]:
    """Per shape of the `attn` figure: its median µs, spread and floor / µs; µs / the decode's
    at the same bs (vs_decode, NaN without one); the fastest swept launch shape (None unswept)
    and the engine's µs / its µs."""
    cells = doc.get("attn") or []
    decode = {c["bs"]: statistics.median(c["us"]) for c in cells if c["queries"] == 1}
    out = []
    for c in cells:
        us = statistics.median(c["us"])
        best = min(c["sweep"], key=lambda r: r["us"]) if c.get("sweep") else None
        out.append({**{k: c[k] for k in ("shape", "queries", "bs", "kv_len", "splits",
                                          "floor_us")},
                    "us": us, "spread": spread(c["us"]), "n": len(c["us"]),
                    "vs_decode": us / decode[c["bs"]] if c["bs"] in decode else math.nan,
                    "best": best, "vs_best": us / best["us"] if best else math.nan})
    return out


def _attn_lines(doc: dict) -> list[str]:
    rows = attn_rows(doc)
    if not rows:
        return []
    return ["", "## Verify attention at 32k: the split kernel per layer", "",
            "The split-KV attention kernel alone (kernels/triton_attention.py; 20 calls "
            "captured in one CUDA graph, median over 30 replays, repeated as the report's "
            "windows) over rows of 32k entries (pages of 16, shuffled), bf16, llama3.1-8b's "
            "heads: a decode's one query per lane beside a verify of a chain of D nodes (the "
            "frozen arm's tree: D 4 at topk 1, D 8 at topk 4), all reading the same KV bytes "
            "(the floor); *vs decode*: µs / the decode's at the same bs; *fastest launch*: the "
            "fastest BLOCK_N / warps / stages / programs per SM of the sweep, and the engine's "
            "µs over it.", "",
            R.md_table(["shape", "nodes", "splits", "floor µs", "µs (spread, n)", "floor / µs",
                        "vs decode", "fastest launch", "engine / fastest"],
                       [[r["shape"], str(r["queries"]), str(r["splits"]),
                         f"{r['floor_us']:.1f}",
                         f"{r['us']:.1f} ({R.num(r['spread'], '.1%')}, {r['n']})",
                         f"{r['floor_us'] / r['us']:.3f}", R.num(r["vs_decode"], ".2f"),
                         "-" if r["best"] is None else
                         f"{r['best']['launch']}: {r['best']['us']:.1f}",
                         R.num(r["vs_best"], ".2f")] for r in rows])]


def _figure_lines(doc: dict) -> list[str]:
    out = []
    for n, f in doc["figures"].items():
        if f["status"] == "done":
            out.append(f"- {n}: done in {f['seconds']:.0f} s")
        elif f["status"] == "skipped":
            out.append(f"- {n}: SKIPPED (time box: {f['left_s']:.0f} s left)")
        else:
            out.append(f"- {n}: ERROR {f['error']}")
    return out


def render(doc: dict) -> str:
    check(doc)
    bw = bandwidth(doc)
    xs = [x for x in doc["bandwidth"] if x is not None]
    parts = [R.header(doc, TITLE),
             f"- copy bandwidth {bw / 1e12:.3f} TB/s (median of {len(xs)} runs in the run's "
             f"process, spread {R.num(spread(xs), '.1%')}): the floor's bandwidth",
             f"- a cell: one generate of {doc['new_tokens']} new tokens per window after the "
             f"prompts are prefilled once; its {doc['windows']} windows of consecutive decode "
             f"steps (the first {doc['warmup_steps']} dropped) each give a p50 step; noise = "
             f"max / min - 1 over the windows (a ratio's: the larger of its two sides'), at "
             f"least {R.MIN_NOISE:.0%}",
             "- floor = bytes one step reads (weights read, less the untied input embedding, "
             "+ the KV of the mean context) / the copy bandwidth", ""]
    parts += R.note_and_answer(doc, answer(doc))
    fr = floor_rows(doc)
    parts += ["", "## Floor / step", ""]
    parts += [R.md_table(
        ["model", "ctx", "bs", "step ms", "spread", "windows", "floor ms (KV)", "floor / step",
         "target", "verdict"],
        [[r["model"], str(r["ctx"]), str(r["bs"]), f"{r['step_ms']:.3f}",
          R.num(r["spread"], ".1%"), str(r["n"]),
          f"{r['floor_ms']:.3f} ({1e3 * r['kv_bytes'] / bw:.3f})", _ratio(r),
          f">= {r['target']}", verdict(r)] for r in fr]) if fr else "- no target-only cell"]
    sr = spec_rows(doc)
    parts += ["", "## Spec step / target step", ""]
    parts += [R.md_table(
        ["model", "arm", "ctx", "bs", "spec ms", "target ms", "spec / target", "spec floor / "
         "target floor", "spec floor / spec step", "target", "verdict"],
        [[r["model"], r["arm"] + (f", D {r['draft_tokens']}" if r["draft_tokens"] else ""),
          str(r["ctx"]),
          str(r["bs"]), f"{r['spec_ms']:.3f}", f"{r['target_ms']:.3f}", _ratio(r),
          f"{r['floors']:.3f}", f"{r['floor_ms'] / r['spec_ms']:.3f}",
          "-" if r["target"] is None else f"<= {r['target']}", verdict(r)] for r in sr])
              if sr else "- no speculative cell beside a target-only one"]
    parts += ["", "## Where the time goes", ""]
    rows = fr + [r for r in sr if r["target"] is not None]
    for r in rows:
        what = f"{r['model']} {r['arm']} ctx {r['ctx']} bs {r['bs']}"
        if r["ok"]:
            parts.append(f"- {what}: PASS ({_ratio(r)})")
            continue
        k = _where(doc, r)
        floors = _floors_text(r) if "floors" in r else ""
        if k is None:
            parts.append(f"- {what}: MISS ({_ratio(r)}); no kernel table was measured for "
                         f"this cell{'. ' + floors if floors else ''}")
            continue
        parts += ["", f"### {what}: MISS ({_ratio(r)})", "", *([floors, ""] if floors else []),
                  *breakdown_lines(doc, k), "", "Its busiest kernels:", "", *top_kernels(k),
                  ""]
    parts += _plan_lines(doc)
    parts += _gemm_lines(doc)
    parts += _attn_lines(doc)
    parts += ["", "## Figures", "", *_figure_lines(doc)]
    return "\n".join(parts).replace("\n\n\n", "\n\n") + "\n"


# -- the results file ------------------------------------------------------------------------
STEP_KEYS = ("figure", "model", "arm", "ctx", "bs", "ms", "floor_bytes", "kv_bytes")
KERNEL_KEYS = ("label", "model", "arm", "ctx", "bs", "layers", "steps", "kernels")
DOC_KEYS = ("bandwidth", "steps", "kernels", "figures", "new_tokens", "windows",
            "warmup_steps")


def check(doc: dict) -> None:
    """ConfigError naming the first field a dense-floor results file lacks."""
    def need(d: dict, keys, where: str):
        if not isinstance(d, dict):
            raise ConfigError(f"{where} is not a mapping; write the results with "
                              f"{WRITER}.")
        miss = [k for k in keys if k not in d]
        if miss:
            raise ConfigError(f"{where} lacks {miss}; write the results with {WRITER}.")
    need(doc, DOC_KEYS, f"the {KIND} results of {doc.get('date')}_{doc.get('device')}")
    for i, s in enumerate(doc["steps"]):
        need(s, STEP_KEYS, f"steps[{i}]")
    for i, k in enumerate(doc["kernels"]):
        need(k, KERNEL_KEYS, f"kernels[{i}]")


def new_doc(*, new_tokens: int, windows: int, warmup_steps: int) -> dict:
    return {"question": QUESTION, "kind": KIND, "bandwidth": [], "steps": [], "kernels": [],
            "figures": {}, "new_tokens": new_tokens, "windows": windows,
            "warmup_steps": warmup_steps, "gemm_plan": {}}


