"""Generate the notebooks of this folder (JSON, no outputs):  python notebooks/_make.py

Each notebook: a markdown cell stating its question, a `parameters`-tagged cell (papermill),
the run(s), figures, and at the bottom the answer computed from the run, printed and written
to `<out_dir>/answer.json`. Edit the cell sources here, not in the .ipynb files.
Parameter-cell comments must not contain ';' (papermill's parser then skips the line).
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

COMMON_PARAMS = '''\
device = "auto"                 # "cpu", "cuda", "cuda:N" (auto: cuda when present)
model = "random-tiny"           # a zoo preset (e.g. "tiny-code": trained, real acceptance) or an HF dir
simulate_accept_len = 2.5       # simulated tokens per verify (None: the draft's real acceptance)
prompt_len_tokens = 32
output_len_tokens = 32
'''

SETUP = '''\
import json
import shutil
from pathlib import Path

import pandas as pd
from mtplab import RunConfig
from mtplab.config import ConfigError
from mtplab.analysis.plots import save_figure
from mtplab.sweep import grid_from_dict, run_sweep
from mtplab.sweep.effects import arm_effects, effect_answer, plot_effects, repeated_cells
from mtplab.sweep.report import bars, heatmap, notebook_out, timelines, write_answer
%matplotlib inline

out = notebook_out(out_dir)
on_gpu = RunConfig(device=device).device.startswith("cuda")
print("device:", RunConfig(device=device).device, "| output:", out.resolve())
'''


def sweep_cell(base: str, arms: str, axes: str, probe: str | None = None) -> str:
    """The sweep of a notebook; with `probe`, `repeats` interleaved rounds whose round 0 alone
    adds the probe settings (mtplab/sweep/effects.py: repeated_cells)."""
    cells = (f'repeated_cells(base, arms, axes, repeats,\n                       probe={probe})'
             if probe else 'grid_from_dict({"base": base, "arms": arms, "grid": axes}).cells()')
    return f'''\
base = {base}
arms = {arms}
axes = {axes}
for arm in arms:   # an arm that is not available yet fails here, with one sentence
    RunConfig(**{{k: v for k, v in {{**base, **arm}}.items() if k in RunConfig.field_names()}})
sweep_dir = out / "sweep"
if not resume:
    shutil.rmtree(sweep_dir, ignore_errors=True)
cells = {cells}
df = run_sweep(cells, sweep_dir, timeout_s=cell_timeout_s)
failed = df[df["status"] != "ok"]
if len(failed):
    raise RuntimeError("cells did not run: " + "; ".join(failed["error"]))
'''


BASE_ARGS = ('device=device, model=model, draft=draft, simulate_accept_len=simulate_accept_len,'
             '\n            prompts=prompts, prompt_len_tokens=prompt_len_tokens,'
             '\n            output_len_tokens=output_len_tokens, page_size=page_size')
BASE = f'dict({BASE_ARGS}, profile=True)'
# the timed rounds of a repeated sweep: round 0 adds the profiler (the `probe` of sweep_cell)
BASE_TIMED = f'dict({BASE_ARGS})'

SWEEP_PARAMS = '''\
prompts = "random"              # "random" ids, or "code": held-out stdlib code (real acceptance)
resume = False                  # True: keep finished cells of an earlier run of this notebook
cell_timeout_s = 600
'''
REPEAT_PARAMS = '''\
repeats = 1                     # interleaved rounds of every cell (their spread is the noise)
'''

NOTEBOOKS: dict[str, list[tuple[str, str]]] = {}

NOTEBOOKS["00_quickstart"] = [
    ("md", """\
# 00 · Quickstart — where does one decode step's time go?

**Question.** For one configuration, how long does a decode step take, which stages take that
time, and how much of the step is the GPU idle (bubble fraction)?

One engine: a warm-up generate, the measured generate (tok/s, step time) with the profiler
held in its `wait` phase and the spans paused, the same workload once more with spans for the
stage times (each stage's share is of that generate's step time), then profiled generates of
the same workload for the bubble figures (warm-up steps are in no figure). On a GPU the bubble timeline is drawn from the Kineto trace (device lanes, bubbles
hatched red); on CPU the trace has no GPU lanes, so the timeline shows the event timeline's
host spans and the bubble fraction is NaN."""),
    ("params", COMMON_PARAMS + '''\
draft = "frozen_kv_mtp"         # none | frozen_kv_mtp | eagle
num_steps = 3
topk = 1
page_size = 16
batch_size = 4
out_dir = "traces/notebooks/00_quickstart"   # relative to the repository root
'''),
    ("code", '''\
from pathlib import Path

import pandas as pd
from mtplab import Engine, RunConfig
from mtplab.analysis.bubbles import analyze
from mtplab.analysis.plots import plot_event_timeline, plot_timeline
from mtplab.stages import STAGES
from mtplab.sweep.measure import prompts
from mtplab.sweep.metrics import stage_metrics
from mtplab.sweep.report import notebook_out, write_answer
%matplotlib inline

out = notebook_out(out_dir)
cfg = RunConfig(model=model, draft=draft, device=device, num_steps=num_steps, topk=topk,
                page_size=page_size, max_running_requests=batch_size,
                simulate_accept_len=simulate_accept_len if draft != "none" else None,
                profile=True, event_timeline=True, profile_wait=2, profile_warmup=2,
                profile_active=12, trace_dir=str(out), run_name="quickstart",
                bubble_meter=True)
pd.Series(cfg.manifest()["config"]).to_frame("resolved config")'''),
    ("code", '''\
eng = Engine(cfg)
V = eng.model.config.vocab_size
measured = prompts(batch_size, prompt_len_tokens, V, seed=0)
with eng.profiler.held():                       # the profiler waits: nothing is collected
    eng.generate(prompts(batch_size, prompt_len_tokens, V, seed=1), max_new_tokens=4,
                 ignore_eos=True)                               # warm-up: not measured
    with eng.spans.paused(keep_meter=True):     # no event pairs (they cost GPU step time);
        eng.generate(measured, max_new_tokens=output_len_tokens, ignore_eos=True)   # measured
    # the bubble meter's stamps stay: stats["bubble_frac"] is the unprofiled bubble
    stats = eng.stats()
    first_step = eng.timeline.step + 1
    eng.generate(measured, max_new_tokens=output_len_tokens, ignore_eos=True)   # stage times
    end_step = eng.timeline.step + 1
    spanned = eng.stats()
eng.check_invariants()
while not eng.profiler.done:
    eng.generate(measured, max_new_tokens=output_len_tokens, ignore_eos=True)   # profiled
files = eng.finish()
pd.Series({k: v for k, v in stats.items() if not isinstance(v, (dict, list))}).to_frame("stats")'''),
    ("md", "## The bubble timeline (4 measured decode steps)"),
    ("code", '''\
res = analyze(files["trace0"])                 # profiled steps only
tl = eng.timeline_frame()
on_gpu = res.summary["device"] is not None
if on_gpu:
    dec = res.steps.loc[res.steps["name"].str.startswith("step[decode"), "step"]
    a = int(dec.iloc[min(1, len(dec) - 1)])
    fig = plot_timeline(files["trace0"], res, steps=(a, a + 3), path=out / "timeline.png")
else:
    dec = sorted(tl.loc[tl["step"].between(first_step, end_step - 1)
                        & tl["stage"].str.startswith("step[decode"), "step"].unique())
    a = int(dec[min(1, len(dec) - 1)])
    fig = plot_event_timeline(tl, steps=(a, a + 3), path=out / "timeline.png")'''),
    ("md", "## Summary tables: bubbles (trace) and stage times per decode step (event timeline)"),
    ("code", '''\
pd.Series({k: v for k, v in res.summary.items() if k != "notes"}).to_frame("bubble summary")'''),
    ("code", '''\
tm = stage_metrics(tl, first_step, end_step)
step_ms = stats["decode_step_p50_ms"]
# top-level stages only: draft.step (and the folded seed) run inside the draft span
nested = {"draft.step"} | ({"draft.seed"} if cfg.fold_seed else set())
stages = pd.Series({s: tm[f"stage_{s}_ms"] for s in STAGES
                    if s not in nested and f"stage_{s}_ms" in tm}).sort_values(ascending=False)
table = pd.DataFrame({"ms_per_decode_step": stages,
                      "share_of_step": stages / spanned["decode_step_p50_ms"]})
table'''),
    ("md", "## Answer"),
    ("code", '''\
top = table.head(3)
write_answer(out, {
    "question": "where does one decode step's time go?",
    "decode_step_time_p50_ms": step_ms,
    "tok_per_s": stats["tok_per_s"],
    "accept_len": stats.get("accept_len"),
    "top_stages": ", ".join(f"{s} {r.share_of_step:.0%}" for s, r in top.iterrows()),
    "bubble_frac": stats["bubble_frac"],                    # the meter, measured run
    "bubble_frac_profiled": res.summary["bubble_frac"],     # the trace (profiler inflates)
    "timeline_png": str(out / "timeline.png"),
})
if not on_gpu:
    print("(CPU run: no GPU lanes in the trace, so bubble_frac_profiled is NaN; bubble_frac is "
          "the meter on the host clock; run with device='cuda' for device bubbles)")'''),
]

NOTEBOOKS["01_overlap"] = [
    ("md", """\
# 01 · Overlap scheduling — what does overlap (and zero-bubble on top) buy?

**Question.** Across batch sizes, how much do decode tok/s and the GPU bubble fraction change
when the overlap scheduler is on, and when zero-bubble scheduling is added on top?

Three arms × batch sizes × `repeats` interleaved rounds, each cell in its own process
(`mtplab.sweep`). The headline bubble is the bubble meter's `bubble_frac` (GPU-stamped stage
intervals of the unprofiled timed generate, mtplab/instrument/meter.py; on CPU it uses the
host clock). Round 0 is also profiled: its `bubble_frac_profiled` and cause split (the
profiler inflates host time) and its timelines are the where/why views. The answer compares
each arm with its baseline: the tok/s ratio against the repeats' noise, and the meter's bubble
change in points; an arm within the noise is said to buy nothing, with the numbers."""),
    ("params", COMMON_PARAMS + '''\
draft = "frozen_kv_mtp"
page_size = 16
batch_sizes = [1, 4]
''' + REPEAT_PARAMS + SWEEP_PARAMS + '''\
out_dir = "traces/notebooks/01_overlap"   # relative to the repository root
'''),
    ("code", SETUP),
    ("code", sweep_cell(BASE_TIMED, '[{"overlap": False}, {"overlap": True},\n        '
                                    '{"overlap": True, "zero_bubble": True}]',
                        '{"batch_size": batch_sizes}', probe='{"profile": True}') + '''\
df["arm"] = ["zero-bubble" if zb else "overlap" if ov else "off"
             for ov, zb in zip(df["cfg.overlap"], df["cfg.zero_bubble"])]
df[["arm", "batch_size", "repeat", "decode_tok_per_s", "decode_step_time_p50_ms",
    "tpot_p50_ms", "bubble_frac", "bubble_frac_profiled", "bubble_sync_frac",
    "bubble_host_frac"]]'''),
    ("md", "## Decode tok/s and the meter's bubble fraction by batch size (mean of the rounds)"),
    ("code", '''\
ax = bars(df, "batch_size", "decode_tok_per_s", "arm")
save_figure(ax.figure, out / "tok_s.png")
ax = bars(df, "batch_size", "bubble_frac", "arm")
ax.set_ylabel("bubble_frac (meter)")
save_figure(ax.figure, out / "bubble_frac.png");'''),
    ("md", "## What each arm buys (median of the rounds vs its baseline)"),
    ("code", '''\
eff = arm_effects(df, "arm", [("overlap", "off"), ("zero-bubble", "overlap"),
                              ("zero-bubble", "off")], by=["batch_size"])
plot_effects(eff, path=out / "effects.png", title="01: what overlap and zero-bubble buy")
eff[["where", "arm", "baseline", "verdict", "ratio", "noise", "tok_s", "tok_s_base",
     "bubble_base", "bubble", "bubble_pts", "bubble_noise_pts"]]'''),
    ("md", "## Timelines at the largest batch size, round 0 (profiled; same time scale)"),
    ("code", '''\
timelines(df[(df["batch_size"] == max(batch_sizes)) & (df["repeat"] == 0)], "arm",
          out_dir=out);'''),
    ("md", "## Answer"),
    ("code", '''\
ans = {"question": "what do overlap and zero-bubble buy in decode tok/s and bubble fraction?",
       **effect_answer(eff), "repeats": repeats, "device": df["device_name"].iloc[0],
       "model": model}
probe = df[df["repeat"] == 0]
for (bs, arm), r in probe.groupby(["batch_size", "arm"]):
    ans[f"bs{bs}.{arm}.bubble_frac_profiled"] = r["bubble_frac_profiled"].median()
write_answer(out, ans);'''),
]

NOTEBOOKS["02_seed_folding"] = [
    ("md", """\
# 02 · Seed folding — what does folding the Frozen-KV seed into the draft graph save?

**Question.** With `fold_seed` on, the seed forward runs as iteration 0 inside the draft
(one graph replay) instead of eagerly before it. How much draft-stage time per decode step and
how many launches does that save, with and without CUDA graphs, and what does it buy in
decode tok/s and bubble fraction?

`cuda_graphs` is swept only on a GPU. Launch counts are CUDA launch calls inside the
`draft.seed`/`draft` spans of the Kineto trace (`draft_launches_per_step`, mtplab/sweep/metrics.py;
round 0, the profiled one); on CPU there are no launches, so the aten ops dispatched inside
those spans stand in. The bubble is the bubble meter's `bubble_frac` (unprofiled); tok/s and
bubble changes are judged against the spread of `repeats` interleaved rounds.

**On CPU** the question has no real answer: without CUDA graphs folding cannot merge
launches, so the draft-time ratio compares host compute of the same work (its spread is
timing noise, not a saving) and `launches_saved` counts aten ops, where the folded seed
dispatches a few more bookkeeping ops than the eager one (the saving can be negative). The figures show that the arms run
and what they measure; run with `device="cuda"` for the saving itself."""),
    ("params", COMMON_PARAMS + '''\
page_size = 16
batch_sizes = [1, 4]
cuda_graphs = None              # cuda_graphs values (None: [False, True] on a GPU, [False] on CPU)
''' + REPEAT_PARAMS + SWEEP_PARAMS + '''\
out_dir = "traces/notebooks/02_seed_folding"   # relative to the repository root
'''),
    ("code", SETUP + '''\
draft = "frozen_kv_mtp"
if cuda_graphs is None:
    cuda_graphs = [False, True] if on_gpu else [False]
'''),
    ("code", sweep_cell(BASE_TIMED, '[{"fold_seed": False}, {"fold_seed": True}]',
                        '{"batch_size": batch_sizes, "cuda_graphs": cuda_graphs}',
                        probe='{"profile": True}') + '''\
df["arm"] = ["folded seed" if f else "eager seed" for f in df["cfg.fold_seed"]]
# the eager seed runs before the draft span; the folded seed runs inside it
seed_ms = df["stage_draft.seed_ms"].fillna(0.0) if "stage_draft.seed_ms" in df else 0.0
df["draft_ms_per_step"] = df["stage_draft_ms"] + seed_ms * ~df["cfg.fold_seed"]
launch_col = "draft_launches_per_step" if on_gpu else "draft_ops_per_step"
df[["batch_size", "cfg.cuda_graphs", "arm", "repeat", "draft_ms_per_step", launch_col,
    "decode_step_time_p50_ms", "decode_tok_per_s", "bubble_frac"]]'''),
    ("md", "## Draft-stage time and launches per decode step (mean of the rounds)"),
    ("code", '''\
hue = ["cfg.cuda_graphs", "arm"]
save_figure(bars(df, "batch_size", "draft_ms_per_step", hue).figure, out / "draft_ms.png")
save_figure(bars(df, "batch_size", launch_col, hue).figure, out / "draft_launches.png");'''),
    ("md", "## What folding buys (median of the rounds vs the eager seed)"),
    ("code", '''\
eff = arm_effects(df, "arm", [("folded seed", "eager seed")], by=["batch_size", "cfg.cuda_graphs"],
                  extra=["draft_ms_per_step", launch_col])
eff["sentence"] = [
    f"{s} Draft stage: {r['draft_ms_per_step_base']:.3f} -> {r['draft_ms_per_step']:.3f} ms "
    f"per decode step ({r['draft_ms_per_step'] / r['draft_ms_per_step_base']:.2f}x), "
    f"{launch_col} {r[launch_col + '_base']:.1f} -> {r[launch_col]:.1f}."
    for s, r in zip(eff["sentence"], eff.to_dict("records"))]
plot_effects(eff, path=out / "effects.png", title="02: what folding the seed buys")
eff[["where", "verdict", "ratio", "noise", "bubble_pts", "draft_ms_per_step_base",
     "draft_ms_per_step", f"{launch_col}_base", launch_col]]'''),
    ("md", "## Answer"),
    ("code", '''\
ans = {"question": "what does fold_seed save in draft time and launches per decode step, "
                   "and what does it buy in tok/s and bubble?",
       **effect_answer(eff), "launch_column": launch_col, "repeats": repeats,
       "device": df["device_name"].iloc[0], "model": model}
for r in eff.to_dict("records"):
    key = f"bs{r['batch_size']}_graphs{r['cfg.cuda_graphs']}"
    ans[f"draft_ms_ratio_{key}"] = r["draft_ms_per_step"] / r["draft_ms_per_step_base"]
    ans[f"launches_saved_{key}"] = r[f"{launch_col}_base"] - r[launch_col]
if not on_gpu:
    ans["note"] = ("CPU run: no launches or graphs to save. launches_saved counts aten ops "
                   "(it can be negative: the folded seed may dispatch a few more) and "
                   "draft_ms_ratio compares host compute of the same work (noise, not a "
                   "saving). Run with device='cuda' for the saving.")
write_answer(out, ans);'''),
]

NOTEBOOKS["03_page_topk"] = [
    ("md", """\
# 03 · Page size × top-k — accept length against step time and KV reserve

**Question.** How do `page_size` and `topk` (for the Frozen-KV MTP and the EAGLE draft) trade
accept length against decode step time, KV reserved per request and bubble fraction, and which
combination gives the most tok/s?

With simulated acceptance (the default on `random-tiny`) the accept length is set by
`simulate_accept_len`, so only the cost side varies; use `model="tiny-code"` and
`simulate_accept_len=None` for real acceptance. The KV reserve per request and decode step
(`kv_reserved_per_req_tokens`) grows with topk when the draft owns KV and pages are > 1
(docs/design.md "KV memory"). Bubble fraction needs a GPU."""),
    ("params", COMMON_PARAMS + '''\
batch_size = 4
num_steps = 3
page_sizes = [1, 16]
topks = [1, 2]
drafts = ["frozen_kv_mtp", "eagle"]
''' + SWEEP_PARAMS + '''\
out_dir = "traces/notebooks/03_page_topk"   # relative to the repository root
'''),
    ("code", SETUP + 'draft, page_size = drafts[0], page_sizes[0]\n'),
    ("code", sweep_cell(BASE.replace("profile=True)", "profile=True,\n            "
                                     "batch_size=batch_size, num_steps=num_steps)"),
                        '[{"draft": d} for d in drafts]',
                        '{"page_size": page_sizes, "topk": topks}') + '''\
df[["cfg.draft", "cfg.page_size", "cfg.topk", "cfg.num_draft_tokens", "accept_len",
    "decode_step_time_p50_ms", "kv_reserved_per_req_tokens", "bubble_frac", "tok_per_s"]]'''),
    ("md", "## Heatmaps per draft"),
    ("code", '''\
import matplotlib.pyplot as plt
values = ["accept_len", "decode_step_time_p50_ms", "kv_reserved_per_req_tokens"]
values += ["bubble_frac"] if on_gpu else []
for d in drafts:
    fig, axs = plt.subplots(1, len(values), figsize=(4.2 * len(values), 3.2))
    for ax, v in zip(axs, values):
        heatmap(df[df["cfg.draft"] == d], "cfg.page_size", "cfg.topk", v, ax=ax)
    fig.suptitle(f"draft={d}", fontsize=10)
    fig.tight_layout()'''),
    ("md", "## Answer"),
    ("code", '''\
ans = {"question": "which page_size x topk gives the most tok/s, at what KV reserve?"}
for d, g in df.groupby("cfg.draft"):
    best = g.loc[g["tok_per_s"].idxmax()]
    ans[f"best_{d}"] = f"page_size={best['cfg.page_size']}, topk={best['cfg.topk']}"
    ans[f"best_{d}_tok_per_s"] = best["tok_per_s"]
    ans[f"kv_reserve_range_{d}_tokens"] = (f"{g['kv_reserved_per_req_tokens'].min()}"
                                           f"..{g['kv_reserved_per_req_tokens'].max()}")
write_answer(out, ans);'''),
]

NOTEBOOKS["04_zero_bubble"] = [
    ("md", """\
# 04 · Zero-bubble knobs — which one removes which host sync?

**Question.** Under the overlap scheduler, what does each zero-bubble sub-knob
(`zb_async_d2h`: pinned async D2H of results, `zb_device_seq_lens`: no host read of
seq_lens, `zb_draft_preexec`: draft pre-execution) do on its own, what do they do together,
which host syncs remain, and what does each buy in decode tok/s and bubble fraction?

Arms: overlap only (every sub-knob off, the baseline); each sub-knob on its own;
`zero_bubble=True` (all on); `repeats` interleaved rounds. Round 0 is the where/why probe:
profiled, and on a GPU under CUDA's sync debug mode (`debug_syncs`, which slows the step, so
its tok/s is left out when later rounds exist). Remaining syncs: host `sync` spans per decode
step (event timeline, any device), host synchronize calls per decode step (trace), the `sync`
share of the profiled bubble, and on a GPU the sites the sync debug mode flags. The headline
bubble is the bubble meter's `bubble_frac` (unprofiled)."""),
    ("params", COMMON_PARAMS + '''\
draft = "frozen_kv_mtp"
page_size = 16
batch_size = 4
''' + REPEAT_PARAMS + SWEEP_PARAMS + '''\
out_dir = "traces/notebooks/04_zero_bubble"   # relative to the repository root
'''),
    ("code", SETUP),
    ("code", 'OFF = {"zero_bubble": False, "zb_async_d2h": False, "zb_device_seq_lens": False,\n'
             '       "zb_draft_preexec": False}\n' +
     sweep_cell(BASE_TIMED.replace("page_size=page_size)", "page_size=page_size,\n            "
                                   "batch_size=batch_size, overlap=True)"), '''[
    {**OFF},                                                  # overlap only
    {**OFF, "zb_async_d2h": True},                            # each sub-knob on its own
    {**OFF, "zb_device_seq_lens": True},
    {**OFF, "zb_draft_preexec": True},
    {"zero_bubble": True},                                    # all of them
]''', '{}', probe='{"profile": True, "debug_syncs": on_gpu}') + '''\
subs = ["cfg.zb_async_d2h", "cfg.zb_device_seq_lens", "cfg.zb_draft_preexec"]
df["arm"] = ["zero_bubble (all)" if r["cfg.zero_bubble"] else
             " + ".join(c.removeprefix("cfg.zb_") for c in subs if r[c]) or "overlap only"
             for _, r in df.iterrows()]
probe = df[df["repeat"] == 0]
# the rounds timed without the sync debug mode (all of them on CPU, where it is off)
timed = df[~df["cfg.debug_syncs"]] if (~df["cfg.debug_syncs"]).any() else df
cols = ["arm", "repeat", "decode_tok_per_s", "decode_step_time_p50_ms", "sync_spans_per_step",
        "host_syncs_per_step", "listed_syncs_per_step", "bubble_frac", "bubble_frac_profiled",
        "bubble_sync_frac"]
df[cols]'''),
    ("md", "Sync sites CUDA's sync debug mode flagged per arm (GPU only; empty on CPU):"),
    ("code", '''\
for arm, sites in zip(probe["arm"], probe["listed_syncs_json"]):
    print(arm, "->", json.loads(sites) if isinstance(sites, str) else "n/a")'''),
    ("md", "## Remaining syncs per arm, and the meter's bubble fraction (mean of the rounds)"),
    ("code", '''\
save_figure(bars(df, "arm", "sync_spans_per_step").figure, out / "sync_spans.png")
save_figure(bars(probe, "arm", "host_syncs_per_step").figure, out / "host_syncs.png")
ax = bars(timed, "arm", "bubble_frac")
ax.set_ylabel("bubble_frac (meter)")
save_figure(ax.figure, out / "bubble_frac.png")
if on_gpu:
    ax = bars(probe, "arm", "bubble_sync_frac")
    save_figure(ax.figure, out / "bubble_sync_profiled.png")'''),
    ("md", "## What each sub-knob buys (median of the timed rounds vs overlap only)"),
    ("code", '''\
arm_names = list(dict.fromkeys(df["arm"]))
eff = arm_effects(timed, "arm", [(a, "overlap only") for a in arm_names[1:]],
                  by=["batch_size"], extra=["sync_spans_per_step"])
eff["sentence"] = [
    f"{s} Host sync spans per decode step {r['sync_spans_per_step_base']:.2f} -> "
    f"{r['sync_spans_per_step']:.2f}."
    for s, r in zip(eff["sentence"], eff.to_dict("records"))]
plot_effects(eff, path=out / "effects.png", title="04: what each zero-bubble sub-knob buys")
eff[["where", "arm", "verdict", "ratio", "noise", "bubble_pts", "bubble_noise_pts",
     "sync_spans_per_step_base", "sync_spans_per_step"]]'''),
    ("md", "## Answer"),
    ("code", '''\
ans = {"question": "which zero-bubble sub-knob removes which host syncs, what remains, and "
                   "what does each buy?",
       **effect_answer(eff), "repeats": repeats, "timed_rounds": int(timed["repeat"].nunique()),
       "device": df["device_name"].iloc[0], "model": model}
for arm, g in df.groupby("arm", sort=False):
    ans[f"{arm}.sync_spans_per_step"] = g["sync_spans_per_step"].median()
    ans[f"{arm}.host_syncs_per_step"] = probe.loc[probe["arm"] == arm,
                                                  "host_syncs_per_step"].median()
ans["remaining_sync_spans_all_on"] = ans["zero_bubble (all).sync_spans_per_step"]
write_answer(out, ans);'''),
]

NOTEBOOKS["05_trace_explorer"] = [
    ("md", """\
# 05 · Trace explorer

**Question.** In a given Kineto trace, which steps have the largest bubbles, and what causes
them?

Load any Kineto trace (mtplab, SGLang, vLLM or plain PyTorch; `trace_path`). Left at `None`,
it records a small run on a GPU; on a CPU it opens the H100 run shipped with mtplab
(`mtplab.analysis.example`), so real per-stream bubbles show on a laptop (`"record"` records
a CPU run instead: host lanes only, no bubbles). Explore one step at a time: the slider picks
the step, the toggles pick host threads / GPU streams and stages (the step's time axis stays
put), the table lists that step's bubbles (device gaps) filtered by cause. Under papermill the
widgets render once and nothing blocks; the static figure below them shows the first analysed
step."""),
    ("params", '''\
trace_path = None               # a .pt.trace.json(.gz) file, "record", or None (see above)
skip_steps = None               # leading steps to drop (None: the warm-up rule of mtplab analyze)
device = "auto"
model = "random-tiny"
draft = "frozen_kv_mtp"
simulate_accept_len = 2.5
out_dir = "traces/notebooks/05_trace_explorer"   # relative to the repository root
'''),
    ("code", '''\
from pathlib import Path

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display
from matplotlib.patches import Patch
from mtplab import RunConfig
from mtplab.analysis.bubbles import CAUSES, cause_group, stage_of
from mtplab.analysis.cli import analyze_run
from mtplab.analysis.example import EXAMPLE_TRACE
from mtplab.stages import STAGE_COLORS
from mtplab.analysis.trace_io import GPU_ACTIVITY_CATS, load_trace
from mtplab.sweep.report import notebook_out, write_answer
%matplotlib inline

out = notebook_out(out_dir)
if trace_path is None and not RunConfig(device=device).device.startswith("cuda"):
    trace_path = str(EXAMPLE_TRACE)
    print("no GPU here: opening the H100 example run shipped with mtplab "
          "(trace_path='record' records a CPU run instead)")
if trace_path in (None, "record"):     # record a small profiled run
    from mtplab import Engine
    from mtplab.sweep.measure import prompts
    cfg = RunConfig(model=model, draft=draft, device=device, simulate_accept_len=simulate_accept_len,
                    page_size=16, max_running_requests=4, profile=True, profile_wait=2,
                    profile_warmup=2, profile_active=8, trace_dir=str(out / "traces"),
                    run_name="explorer")
    eng = Engine(cfg)
    eng.generate(prompts(4, 32, eng.model.config.vocab_size, seed=0), max_new_tokens=32,
                 ignore_eos=True)
    trace_path = str(eng.finish()["trace0"])
tr = load_trace(trace_path)
res = analyze_run(tr, skip_steps=skip_steps)
gpu = res.summary["device"] is not None
print(trace_path)
print(f"{res.summary['n_steps']} steps analysed ({res.summary['step_source']}), "
      f"bubble_frac={res.summary['bubble_frac']}")
for note in res.summary["notes"]:
    print("note:", note)'''),
    ("code", '''\
stage_by_code = np.array([stage_of(n) for n in tr.names], dtype=object)
ua, gua = tr.cat_mask("user_annotation"), tr.cat_mask("gpu_user_annotation")
act = tr.cat_mask(*GPU_ACTIVITY_CATS)
has_stage = np.array([s is not None for s in stage_by_code], bool)[tr.name]
hosts = sorted({int(t) for t in tr.tid[ua & has_stage]})
streams = sorted({int(s) for s in tr.stream[act]})
lanes = [f"host {t}" for t in hosts] + [f"stream {s}" for s in streams]
stages_present = [s for s in STAGE_COLORS if s in set(stage_by_code[tr.name[ua | gua]])]
device_gaps = res.gaps[res.gaps["scope"] == "device"]


def draw(step, lanes_on, stages_on):
    """The chosen step: stage spans per host thread / stream, GPU activity, bubbles."""
    row = res.steps[res.steps["step"] == step].iloc[0]
    t0 = min(row["start_us"], row["host_start_us"])
    t1 = max(row["start_us"] + row["dur_us"], row["host_start_us"] + row["host_dur_us"])
    win = (tr.ts < t1) & (tr.end > t0)
    shown = [ln for ln in lanes if ln in lanes_on]
    fig, ax = plt.subplots(figsize=(13, 0.6 * len(shown) + 1.2))
    for y, lane in enumerate(shown):
        kind, key = lane.split()
        on = win & ((ua & (tr.tid == int(key))) if kind == "host" else
                    (gua & (tr.stream == int(key))))
        for st in stages_on:
            sel = np.flatnonzero(on & (stage_by_code[tr.name] == st))
            ax.broken_barh([(tr.ts[i] - t0, tr.dur[i]) for i in sel], (y - 0.4, 0.5),
                           color=STAGE_COLORS[st])
        if kind == "stream":
            sel = np.flatnonzero(win & act & (tr.stream == int(key)))
            ax.broken_barh([(tr.ts[i] - t0, max(tr.dur[i], 0.01)) for i in sel], (y + 0.15, 0.25),
                           color="#303030")
    g = device_gaps[device_gaps["step"] == step]
    ax.broken_barh(list(zip(g["start_us"] - t0, g["gap_us"])), (-0.5, max(len(shown), 1)),
                   color="#d62728", alpha=0.15)
    ax.set_yticks(range(len(shown)), shown)
    ax.set_xlim(0, t1 - t0)              # the step's axis, whichever lanes and stages are on
    ax.invert_yaxis()
    ax.set_xlabel(f"µs from the start of step {step}")
    ax.set_title(f"step {step}: {row['name']}, bubble {row['bubble_us']:.0f} µs "
                 f"of {row['dur_us']:.0f} µs", fontsize=9)
    ax.legend(handles=[Patch(color=STAGE_COLORS[s], label=s) for s in stages_on],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    plt.show()


def gap_table(step, cause):
    g = device_gaps[device_gaps["step"] == step]
    if cause != "all":
        g = g[cause_group(g["cause"]) == cause]        # "host" selects every host:<stage>
    display(g[["start_us", "gap_us", "cause", "before", "after"]].reset_index(drop=True))


first = int(res.steps["step"].iloc[0])
draw(first, lanes, stages_present)       # static view (also what papermill stores)'''),
    ("md", "## Interactive view"),
    ("code", '''\
step_w = W.IntSlider(value=first, min=int(res.steps["step"].min()),
                     max=int(res.steps["step"].max()), description="step")
lanes_w = W.SelectMultiple(options=lanes, value=tuple(lanes), description="lanes", rows=4)
stages_w = W.SelectMultiple(options=stages_present, value=tuple(stages_present),
                            description="stages", rows=6)
cause_w = W.Dropdown(options=["all", *CAUSES], value="all", description="cause")
plot_out = W.interactive_output(lambda step, lanes_on, stages_on: draw(step, lanes_on, stages_on),
                                {"step": step_w, "lanes_on": lanes_w, "stages_on": stages_w})
table_out = W.interactive_output(gap_table, {"step": step_w, "cause": cause_w})
display(W.VBox([W.HBox([step_w, cause_w]), W.HBox([lanes_w, stages_w]), plot_out, table_out]))'''),
    ("md", """\
## Open the same trace elsewhere
* **TensorBoard** (torch-tb-profiler): point `--logdir` at the folder that holds the run
  folders (each run folder is a run, the file-name prefix before `.pt.trace.json.gz` is the
  worker).
* **Perfetto**: open https://ui.perfetto.dev and drag the `.json.gz` file in (no unzip
  needed); for traces above a few hundred MB use `trace_processor --httpd`."""),
    ("code", '''\
p = Path(trace_path).resolve()
print(f"tensorboard --logdir {p.parent.parent}   # then open the PYTORCH_PROFILER tab")
print(f"Perfetto: https://ui.perfetto.dev -> Open trace file -> {p}")'''),
    ("md", "## Answer"),
    ("code", '''\
worst = res.steps.sort_values("bubble_us", ascending=False).head(3)
by_cause = device_gaps.groupby("cause")["gap_us"].sum().sort_values(ascending=False)
write_answer(out, {
    "question": "which steps have the largest bubbles, and what causes them?",
    "trace_path": str(trace_path),
    "bubble_frac": res.summary["bubble_frac"],
    "worst_steps": ", ".join(f"{int(r.step)} ({r.bubble_us:.0f} us)" for r in worst.itertuples())
                   if gpu else "n/a (no GPU lanes in this trace)",
    "main_cause": by_cause.index[0] if len(by_cause) else "n/a",
});'''),
]

NOTEBOOKS["06_sweep_report"] = [
    ("md", """\
# 06 · Sweep report — which configuration is fastest, per batch size?

**Question.** In a sweep's results table, which configuration gives the most tok/s at each
batch size, and how do TPOT, ITL, step time, accept length and bubble fraction compare?

Reads `results.parquet` of any `mtplab sweep` (`results_path`: the file or its folder), or
leave it `None` to run a tiny sweep first. Failed and dropped cells are listed with their
reason; the figures use the ok cells."""),
    ("params", '''\
results_path = None             # results.parquet or a sweep folder (None: run a tiny sweep)
device = "auto"
model = "random-tiny"
out_dir = "traces/notebooks/06_sweep_report"   # relative to the repository root
'''),
    ("code", '''\
import shutil
from pathlib import Path

import pandas as pd
from mtplab.sweep import grid_from_dict, run_sweep
from mtplab.sweep.report import (label, load_results, notebook_out, standard_figures, varying,
                                 write_answer)
%matplotlib inline

out = notebook_out(out_dir)
if results_path is None:
    results_path = out / "sweep"
    shutil.rmtree(results_path, ignore_errors=True)
    grid = grid_from_dict({
        "base": {"device": device, "model": model, "draft": "frozen_kv_mtp",
                 "simulate_accept_len": 2.5, "prompt_len_tokens": 16, "output_len_tokens": 16,
                 "profile": True},
        "grid": {"batch_size": [1, 4], "page_size": [1, 16]}})
    run_sweep(grid.cells(), results_path)
df = load_results(results_path)
print(df["status"].value_counts().to_dict())
df[df["status"] != "ok"][["cell_id", "status", "error"]]'''),
    ("code", '''\
axes = varying(df)
print("settings that vary:", axes)
ok = df[df["status"] == "ok"]
cols = ["cell_id", *axes, "tok_per_s", "tpot_p50_ms", "itl_p99_ms", "decode_step_time_p50_ms",
        "accept_len", "bubble_frac"]
ok[[c for c in cols if c in ok.columns]]'''),
    ("md", "## Standard figures"),
    ("code", "figs = standard_figures(df, out_dir=out)"),
    ("md", "## Answer"),
    ("code", '''\
others = [c for c in axes if c != "batch_size"]
ans = {"question": "which configuration is fastest per batch size?",
       "cells_ok": int(len(ok)), "cells_not_ok": int(len(df) - len(ok))}
for bs, g in ok.groupby("batch_size"):
    best = g.loc[g["tok_per_s"].idxmax()]
    ans[f"best_bs{bs}"] = label(best.to_frame().T, others).iloc[0]
    ans[f"best_bs{bs}_tok_per_s"] = best["tok_per_s"]
write_answer(out, ans);'''),
]


def build(name: str, cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python",
                                  "name": "python3"},
                   "language_info": {"name": "python"}}
    for kind, src in cells:
        if kind == "md":
            nb.cells.append(new_markdown_cell(src))
        else:
            cell = new_code_cell(src)
            if kind == "params":
                cell.metadata["tags"] = ["parameters"]
            nb.cells.append(cell)
    for i, c in enumerate(nb.cells):     # stable ids: regenerating gives identical files
        c["id"] = f"{name[:2]}-{i:02d}"
    return nb


def main() -> int:
    for name, cells in NOTEBOOKS.items():
        nb = build(name, cells)
        nbformat.validate(nb)
        nbformat.write(nb, HERE / f"{name}.ipynb")
        print(f"wrote notebooks/{name}.ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
