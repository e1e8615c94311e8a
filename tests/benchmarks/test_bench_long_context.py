"""benchmarks/bench_long_context.py (studies/long_context/floor_runner.py) without a GPU: a
cell's windows and floor land in the results doc, each figure's outcome is kept (done, an
error, skipped by the time box), the kernel table's steps are decode steps, and the doc
renders (timings not asserted)."""
from __future__ import annotations

import pytest

from mtplab import Engine, RunConfig
from mtplab.studies.long_context import floor_report as F
from mtplab.studies.long_context import floor_runner as run
from mtplab.studies import reports as R


def _run(budget_s: float = 100.0, windows: int = 3) -> run.Run:
    r = run.Run(F.new_doc(new_tokens=run.NEW, windows=windows, warmup_steps=run.WARMUP),
                budget_s, windows, kernel_tables=True)
    r.doc["bandwidth"] = [1.0e11, 1.1e11, 0.9e11]
    return r


def test_windows_drop_the_warmup_and_the_drain():
    xs = [9.0] * run.WARMUP + [0.001] * 4 + [0.002] * 4 + [0.003] * 4 + [9.0]
    assert run.windows_ms(xs, 3) == pytest.approx([1.0, 2.0, 3.0])
    with pytest.raises(RuntimeError, match="decode steps for 3 windows"):
        run.windows_ms([1.0] * (run.WARMUP + 3), 3)


def test_figure_outcomes_are_kept():
    r = _run()
    r.figure("short", lambda _: None, reserve_s=0)
    r.figure("llama", lambda _: 1 / 0, reserve_s=0)
    r.figure("frozen", lambda _: None, reserve_s=1000)
    f = r.doc["figures"]
    assert f["short"]["status"] == "done" and f["frozen"]["status"] == "skipped"
    assert f["llama"] == {"status": "error", "error": "ZeroDivisionError: division by zero"}


def test_a_cell_and_a_kernel_table_on_cpu(monkeypatch):
    r = _run()
    monkeypatch.setattr(run, "NEW", 6)
    eng = Engine(RunConfig(model="random-tiny", max_running_requests=2, context_len=128,
                           page_size=16, overlap=True, zero_bubble=True))
    row = r.cell(eng, "short", "random-tiny", "target", 24, 2)
    assert len(row["ms"]) == 3 and row["floor_bytes"] > row["kv_bytes"] > 0
    assert r.doc["steps"] == [row]
    seen = []

    def activities(fn):
        before = eng.scheduler.stats.decode_steps
        fn()
        seen.append(eng.scheduler.stats.decode_steps - before)
        return [["nvjet_qkv", 2.0], ["_split_kernel", 1.0]]

    monkeypatch.setattr(run, "ordered_activities", activities)
    monkeypatch.setattr(run, "proj_bytes", lambda eng: {"qkv": 1e6})
    r.kernels(eng, "target-only random-tiny", "random-tiny", "target", 24)
    assert seen == [run.PROFILED]               # three decode steps, after the prefill
    k = r.doc["kernels"][0]
    assert k["steps"] == run.PROFILED and k["kernels"][0] == ["nvjet_qkv", 2.0]
    assert eng.idle
    eng.close()
    r.doc["figures"]["short"] = {"status": "done", "seconds": 1.0}
    doc = R.plain(R.stamped(r.doc, date="2026-11-29", device="cpu", device_name="cpu",
                              commit="abc1234", command="x"))
    md = F.render(doc)
    assert "| random-tiny | 24 | 2 |" in md and "- short: done in 1 s" in md


def test_the_hot_vocabulary_arm_is_named_in_its_cell_and_in_the_answer(monkeypatch):
    r = _run()
    monkeypatch.setattr(run, "NEW", 6)
    eng = Engine(RunConfig(model="random-tiny", max_running_requests=2, context_len=256,
                           page_size=16, overlap=True, zero_bubble=True, draft_vocab="hot:64",
                           **run.FROZEN))
    row = r.cell(eng, "hot", "random-tiny", "frozen_kv_mtp topk 1 hot:64", 24, 2)
    assert row["draft_vocab"] == "hot:64" and row["topk"] == 1
    eng.close()
    doc = _run().doc
    base = dict(model="m", ctx=F.SPEC_CTX, bs=1, topk=1, floor_bytes=1e9, kv_bytes=1e8,
                weight_bytes=9e8, figure="frozen")
    doc["steps"] = [dict(base, arm="target", ms=[4.0] * 3, draft_tokens=None),
                    dict(base, arm="frozen_kv_mtp topk 1", ms=[5.6] * 3, draft_tokens=4),
                    dict(base, arm="frozen_kv_mtp topk 1 hot:64", ms=[4.8] * 3,
                         draft_tokens=4, draft_vocab="hot:64"),
                    dict(base, arm="frozen_kv_mtp topk 1 kv window 4096", ms=[5.2] * 3,
                         draft_tokens=4, draft_kv_window=4096)]
    ans = F.answer(doc)
    assert "1.400 ±2.0% MISS (<= 1.25; floors 1.000) for topk 1 bs 1" in ans
    assert "1.200 ±2.0% PASS (<= 1.25; floors 1.000) for topk 1 hot:64 bs 1" in ans
    assert "1.300 ±2.0% MISS (<= 1.25; floors 1.000) for topk 1 kv window 4096 bs 1" in ans


def test_the_kv_window_arm_records_its_window_and_a_floor_at_it(monkeypatch):
    r = _run()
    monkeypatch.setattr(run, "NEW", 6)
    eng = Engine(RunConfig(model="random-tiny", max_running_requests=2, context_len=256,
                           page_size=16, overlap=True, zero_bubble=True, draft_kv_window=8,
                           **run.FROZEN))
    row = r.cell(eng, "window", "random-tiny", "frozen_kv_mtp topk 1 kv window 8", 24, 2)
    eng.close()
    wide = Engine(RunConfig(model="random-tiny", max_running_requests=2, context_len=256,
                            page_size=16, overlap=True, zero_bubble=True, **run.FROZEN))
    full = r.cell(wide, "frozen", "random-tiny", "frozen_kv_mtp topk 1", 24, 2)
    wide.close()
    assert row["draft_kv_window"] == 8 and "draft_kv_window" not in full
    assert row["kv_bytes"] < full["kv_bytes"]         # the draft reads 8 entries, not ~30


def test_the_gemm_figure_measures_at_the_runs_bandwidth(monkeypatch):
    from mtplab.studies.decode_floor import gemv_figures
    seen = {}

    def measure(rows, with_configs, repeats, bw):
        seen.update(rows=rows, with_configs=with_configs, repeats=repeats, bw=bw)
        return {"cells": [{"shape": "qkv"}]}

    monkeypatch.setattr(gemv_figures, "measure", measure)
    r = _run()
    r.figure("gemm", run.fig_gemm, reserve_s=0)
    assert r.doc["figures"]["gemm"]["status"] == "done" and r.doc["gemm"] == [{"shape": "qkv"}]
    assert seen == dict(rows=[1, 8], with_configs=True, repeats=3, bw=F.bandwidth(r.doc))


def test_the_attn_figure_measures_the_verify_shapes_at_the_runs_bandwidth(monkeypatch):
    from mtplab.studies.long_context import attention_figures as af
    seen = {}

    def measure(shapes, sweep, bw, repeats):
        seen.update(shapes=shapes, sweep=sweep, bw=bw, repeats=repeats)
        return [{"shape": shapes[0]}]

    monkeypatch.setattr(af, "measure", measure)
    r = _run(windows=4)
    r.figure("attn", run.fig_attn, reserve_s=0)
    assert r.doc["figures"]["attn"]["status"] == "done"
    assert r.doc["attn"] == [{"shape": "llama decode bs1 32k"}]
    assert seen == dict(shapes=af.VERIFY, sweep=af.VERIFY_SWEEP, bw=F.bandwidth(r.doc),
                        repeats=4)
    assert set(af.VERIFY_SWEEP) <= set(af.VERIFY) <= set(af.SHAPES)
    assert {af.SHAPES[s][0] for s in af.VERIFY} == {"decode", "tree4", "tree8"}


@pytest.mark.parametrize("windows", [1, 3, 5])
def test_the_gemma_figure_fits_its_longest_prompt_in_the_presets_positions(windows):
    """context_len = prompt + the most tokens a cell generates + 16 stays within the preset's
    positions (RunConfig refuses more), in whole pages, and the prompt stays past 31k."""
    from mtplab.models.zoo import model_config
    r = _run(windows=windows)
    ctx = run.gemma_long_ctx(r)
    limit = model_config("gemma4-31b-like@12").max_position_embeddings
    assert ctx % 16 == 0 and ctx + run.new_tokens_max(r) + 16 <= limit == run.GEMMA_POSITIONS
    assert ctx > 31 * 1024
