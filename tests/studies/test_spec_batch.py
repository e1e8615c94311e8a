"""Question `long_context_spec` (studies/long_context/spec_batch.py and its runner): the
crossover finder on synthetic tables, the report rendered from a synthetic results doc
(crossovers, MagicDec beside them, skipped cells with their reason, regeneration byte for byte,
a malformed file -> ConfigError), and the runner's path on CPU with a tiny model and short
contexts (the timings are not asserted; the staggered batch, the cells and the skips are)."""
from __future__ import annotations

import json

import pytest

from mtplab.errors import ConfigError
from mtplab.studies import reports as R
from mtplab.studies import study
from mtplab.studies.cli import main_report
from mtplab.studies.long_context import spec_batch as S
from mtplab.studies.long_context import spec_batch_runner as run

P, C, N, ONE = R.PAYS, R.COSTS, R.NOISE, R.ONE_REPEAT


@pytest.mark.parametrize("points, want", [
    ([(1, P), (2, P), (4, N), (8, P), (16, C), (32, C)], 16),    # pays again at 8: from 16
    ([(32, C), (1, P), (16, N), (8, P)], 16),                      # order does not matter
    ([(1, P), (2, P), (64, P)], None),                             # pays at the largest bs
    ([(1, C), (2, N)], 1),                                         # never pays
    ([(1, P), (2, ONE)], 2),                                       # no verdict is no pay
    ([], None),
])
def test_the_crossover_is_the_smallest_bs_from_which_nothing_pays(points, want):
    assert S.crossover(points) == want


def _cell(ctx, arm, bs, ms, tps):
    return {"ctx": ctx, "arm": arm, "bs": bs, "status": "ok", "ms": ms,
            "tokens_per_step": tps, "steps": 30}


def _doc() -> dict:
    doc = S.new_doc(model="llama3.1-8b-like@32", batches=[1, 8, 32, 64], contexts=[8192, 32768],
                    windows=3, steps_per_level=36)
    cells = []
    for bs, t_ms, s_ms in ((1, 5.0, 6.0), (8, 6.0, 8.0), (32, 10.0, 20.0), (64, 16.0, 40.0)):
        cells += [_cell(8192, "target", bs, [t_ms, t_ms * 1.01, t_ms], bs),
                  _cell(8192, "frozen", bs, [s_ms, s_ms, s_ms * 1.01], 2.5 * bs)]
    for bs, t_ms, s_ms in ((1, 6.0, 7.0), (8, 12.0, 14.0)):
        cells += [_cell(32768, "target", bs, [t_ms] * 3, bs),
                  _cell(32768, "frozen", bs, [s_ms] * 3, 2.5 * bs)]
    why = "the KV does not fit the device: bs 32 x 33000 tokens needs 160 GB"
    cells += [{"ctx": 32768, "arm": arm, "bs": bs, "status": "skipped", "reason": why}
              for arm in ("target", "frozen") for bs in (32, 64)]
    doc["cells"] = cells
    doc["engines"] = [{"ctx": 8192, "arm": "target", "status": "ok", "max_bs": 64,
                       "build_s": 30.0, "prefill_s": 40.0, "steps": 300}]
    return R.plain(R.stamped(doc, date="2026-11-29", device="h200", device_name="NVIDIA H200",
                               commit="abc1234", command="python -m benchmarks.bench_spec_batch"))


def test_the_report_gives_the_crossover_beside_magicdec(tmp_path):
    path = R.write(_doc(), study("long_context_spec").render, tmp_path)
    md = path.read_text()
    # 8k: 2.5 tokens / step: bs 1 2.08x, bs 8 1.875x, bs 32 1.25x, bs 64 1.0x (noise)
    assert S.speedup(_doc(), 8192, "frozen", 64)["verdict"] == R.NOISE
    answer = R.answer_line(path)
    assert answer.startswith("frozen at 8k stops paying from bs 64; frozen at 32k pays at "
                             "every measured bs (up to 8); not measured (see below): 32k bs 32")
    assert "| 32 | 10.000 | 20.000, 2.50, 1.250x ±2.0%, pays |" in md
    assert "| 32 | skipped: the KV does not fit the device: bs 32 x 33000 tokens needs " \
           "160 GB | - |" in md
    assert "MagicDec (ICLR'25" in md
    assert "- here at 8k, bs >= 32: frozen 1.250x ±2.0%, pays at bs 32; frozen 1.000x ±2.0%, " \
           "within the noise at bs 64" in md
    assert "- here at 32k, bs >= 32: not measured" in md


def test_regenerated_byte_for_byte_and_a_malformed_file_is_one_config_error(tmp_path, capsys):
    path = R.write(_doc(), study("long_context_spec").render, tmp_path)
    assert main_report(["long_context_spec", "--root", str(tmp_path)]) == 0      # the index
    assert main_report(["long_context_spec", "--root", str(tmp_path), "--check"]) == 0
    doc = json.loads(path.with_suffix(".json").read_text())
    del doc["cells"][0]["ms"]
    path.with_suffix(".json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"cells\[0\] lacks \['ms'\]"):
        S.render(R.load(path))
    assert main_report(["long_context_spec", "--root", str(tmp_path), "--check"]) == 2
    assert "bench_spec_batch --out-dir DIR" in capsys.readouterr().err


def test_requests_are_staggered_so_the_batch_falls_level_by_level():
    toks = run.request_tokens([1, 2, 4, 8], 8, steps=10, per_step=1.0)
    assert toks == [40, 30, 20, 20, 10, 10, 10, 10]
    assert run.request_tokens([1, 2, 4, 8], 4, steps=10, per_step=2.5) == [75, 50, 25, 25]
    # (seconds, running, tokens out, prefill steps): 3 prefills, 9 decodes at bs 2, 4 at 1
    rows = [(0.5, 2, 0, k) for k in (1, 2, 3)] + [(0.01, 2, 2 * i, 3) for i in range(1, 10)] \
        + [(0.02, 1, 20 + i, 3) for i in range(4)]
    got = run.steady_cells(rows, [1, 2], windows=3)
    assert set(got) == {2}                  # bs 1: 4 iterations, none with 2 either side
    ms, tps, n = got[2]                     # the prefills and their neighbours left out
    assert (tps, n, ms) == (2.0, 6, [10.0, 10.0, 10.0])


def test_the_runner_on_cpu_writes_and_extends_one_report(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234")
    from mtplab.models.memory import estimate_memory
    steps = 10
    one = run.config("random-tiny", 48, 1, max(run.request_tokens([1, 2], 1, steps, 1.0)),
                     "target", "float32", "cpu")
    one.validate()
    gb = estimate_memory(one).device_bytes / run.FREE_SHARE / 1e9 * 1.0001    # bs 1 fits only
    args = ["--out-dir", str(tmp_path), "--model", "random-tiny", "--batches", "1", "2",
            "--steps-per-level", str(steps), "--dtype", "float32", "--device", "cpu",
            "--reserve-s", "0"]
    assert run.main(args + ["--contexts", "32", "--arms", "target", "frozen"]) == 0
    assert run.main(args + ["--contexts", "48", "--arms", "target", "--device-gb",
                            str(gb)]) == 0
    path = next((tmp_path / "long_context_spec").glob("*.md"))
    doc = R.load(path)
    assert doc["contexts"] == [32, 48] and ";" in doc["command"]     # the second run added
    cells = {(c["ctx"], c["arm"], c["bs"]): c for c in doc["cells"]}
    assert set(cells) == {(32, "target", 1), (32, "target", 2), (32, "frozen", 1),
                          (32, "frozen", 2), (48, "target", 1), (48, "target", 2)}
    assert cells[(48, "target", 2)]["status"] == "skipped"
    assert "the KV does not fit the device" in cells[(48, "target", 2)]["reason"]
    for key in ((32, "target", 1), (32, "target", 2), (32, "frozen", 1), (32, "frozen", 2),
                (48, "target", 1)):
        assert cells[key]["status"] == "ok" and len(cells[key]["ms"]) == 3, key
    assert cells[(32, "frozen", 2)]["tokens_per_step"] > 2 * 2      # accept 3.0 per request
    assert cells[(32, "target", 2)]["tokens_per_step"] == 2
    assert S.speedup(doc, 32, "frozen", 2) is not None
    assert "- frozen: draft frozen_kv_mtp, fold_seed True, num_steps 3, " \
           "simulate_accept_len 3.0, topk 1" in path.read_text()      # the first run's arm
    assert S.render(doc) == path.read_text()


def test_an_engine_that_runs_out_of_memory_is_retried_one_level_down(monkeypatch):
    from types import SimpleNamespace

    from mtplab.models.memory import InsufficientMemoryError
    a = SimpleNamespace(model="random-tiny", batches=[1, 2, 4], steps_per_level=10, windows=3,
                        dtype="float32", device="cpu", device_gb=None, budget_s=60.0,
                        reserve_s=0.0)
    r = run.Run(S.new_doc(model=a.model, batches=a.batches, contexts=[32], windows=3,
                          steps_per_level=10), a)
    tried = []

    def measure(ctx, arm, B, batches, tokens_of, per):
        tried.append(B)
        if B > 2:
            raise InsufficientMemoryError(f"needs more than is free at bs {B}")
        rows = [(0.01, 2, 2 * i, 1) for i in range(12)] + [(0.01, 1, 24 + i, 1)
                                                           for i in range(12)]
        return rows, 1.0, 2.0

    monkeypatch.setattr(r, "measure", measure)
    r.cell(32, "target")
    assert tried == [4, 2]
    cells = {c["bs"]: c for c in r.doc["cells"]}
    assert cells[4]["status"] == "skipped" and "ran out of memory" in cells[4]["reason"]
    assert cells[2]["status"] == cells[1]["status"] == "ok"
    assert r.doc["engines"] == [{"ctx": 32, "arm": "target", "status": "ok", "max_bs": 2,
                                 "build_s": 1.0, "prefill_s": 2.0, "steps": 24}]


def test_each_batch_that_does_not_fit_gets_its_own_reason(monkeypatch):
    """largest_fit: bs 4 and 8 need more than is free; each one's reason names its own bs and
    bytes (not the smallest misfit's for all)."""
    need = {1: 10e9, 2: 20e9, 4: 40e9, 8: 80e9}
    monkeypatch.setattr(run, "estimate_memory", lambda cfg: type(
        "M", (), {"device_bytes": need[cfg.max_running_requests]})())
    B, why = run.largest_fit("random-tiny", 32, [1, 2, 4, 8], lambda bs: 8, "target",
                             "float32", "cpu", free=25e9)
    assert B == 2 and sorted(why) == [4, 8]
    assert why[8].startswith("bs 8 x 40 tokens needs 80 GB") and "bs 4 x 40" in why[4]


def test_the_window_arm_runs_its_draft_at_the_window(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234")
    args = ["--out-dir", str(tmp_path), "--model", "random-tiny", "--batches", "1",
            "--steps-per-level", "10", "--dtype", "float32", "--device", "cpu",
            "--reserve-s", "0", "--contexts", "32", "--arms", "target", "frozen-window"]
    assert run.main(args) == 0
    path = next((tmp_path / "long_context_spec").glob("*.md"))
    doc = R.load(path)
    assert [c["status"] for c in doc["cells"]] == ["ok", "ok"]
    assert doc["arm_settings"]["frozen-window"]["draft_kv_window"] == 4096
    assert "draft_kv_window 4096" in path.read_text()
