"""The study `peers` (mtplab/studies/peers): its report rendered from small synthetic cell
records with known figures (the ratio over the interleaved repeats, its noise, the verdict,
each engine's run-ahead, a cell an engine could not run, the answer line), the stamp taken
from the cells, and a malformed results file refused with one ConfigError. The harness's run
that writes it: tests/benchmarks/test_peer_sglang.py."""
from __future__ import annotations

import json
import statistics

import pytest

from mtplab.errors import ConfigError
from mtplab.studies import peers as P
from mtplab.studies import reports as R
from mtplab.studies.cli import main_report

WORKLOAD = {"prompt_len": 256, "new_tokens": 128, "accept_len": 2.5, "repeats": 3,
            "warmup_tokens": 32, "profile_steps": 20, "seed": 0}
ENGINES = {"mtplab": {"engine": "mtplab", "device": "cuda", "torch": "2.11.0"},
           "sglang": {"engine": "sglang", "device": "NVIDIA H200", "sglang": "0.5.17",
                      "torch": "2.11.0"}}


def _arm(tok_s, step_ms=5.0, accept=2.5):
    return {"tok_s": sorted(tok_s)[len(tok_s) // 2], "tok_s_repeats": list(tok_s),
            "ttft_ms": 20.0, "tpot_p50_ms": step_ms / accept, "step_ms": step_ms,
            "decode_steps": 51, "accept_len": accept}


def _trace(ra, p10, p50, p90, bubble=0.1):
    return {"trace": "/tmp/x.trace.json", "bubble_frac": bubble, "steps": 20,
            "run_ahead_frac": ra, "launch_lead_p10_us": p10, "launch_lead_p50_us": p50,
            "launch_lead_p90_us": p90, "run_ahead_steps": 19,
            "top": [["launch", 0.6], ["sync", 0.4]], "causes": {"launch": 0.6, "sync": 0.4}}


def _cell(shape, bs, m, s, commit="abc1234def", date="2026-12-03T04:00:00+00:00"):
    ratios = [a / b for a, b in zip(m, s)]
    return {"cell": f"{shape}|eagle|overlap-on|bs{bs}", "shape": shape, "draft": "eagle",
            "overlap": "on", "bs": bs, "status": "ok", "failed_side": None, "message": None,
            "git_commit": commit, "date": date, "engines": ENGINES,
            "ratio": {"median": statistics.median(ratios), "repeats": ratios},
            "mtplab": _arm(m), "sglang": _arm(s, step_ms=6.0),
            "profile": {"mtplab": {**_trace(1.0, 12.0, 40.0, 95.0),
                                   "meter": {"bubble_frac": 0.05}},
                        "sglang": {**_trace(0.5, -50.0, 1.0, 19000.0), "meter": {}}}}


def _records():
    failed = {"cell": "llama3-8b-like@8|eagle|overlap-on|bs32", "shape": "llama3-8b-like@8",
              "draft": "eagle", "overlap": "on", "bs": 32, "status": "failed",
              "failed_side": "sglang", "message": "RuntimeError: out of memory",
              "git_commit": "abc1234def", "date": "2026-12-02T23:00:00+00:00"}
    return [_cell("random-medium", 1, [1100.0, 1000.0, 1050.0], [1000.0, 1000.0, 1000.0]),
            _cell("random-medium", 8, [5000.0, 5100.0, 4900.0], [6000.0, 6000.0, 6000.0]),
            failed]


def _doc():
    return P.results_doc(_records(), workload=WORKLOAD,
                         command="python -m benchmarks.bench_peer_sglang --out r --out-dir d")


def test_the_report_of_known_figures():
    """bs 1: ratios 1.1, 1.0, 1.05 -> median 1.05; noise mtplab's (1100 - 1000) / 1050 = 9.5%:
    within the noise. bs 8: 5000/6000 .. -> median 0.833; noise (5100 - 4900) / 5000 = 4.0%:
    costs."""
    doc = _doc()
    assert (doc["date"], doc["device"], doc["commit"]) == ("2026-12-03", "h200", "abc1234")
    assert doc["software"] == "mtplab torch 2.11.0; sglang sglang 0.5.17, torch 2.11.0"
    md = P.render(doc)
    assert "| random-medium | eagle | on | 1 | 1050 | 1000 | 1.050x ±9.5%, within the noise | " \
           "2.00 / 2.40 | 5.00 / 6.00 | 2.50 / 2.50 | 5.0% / 10.0% | 10.0% | launch 60%, " \
           "sync 40% | launch 60%, sync 40% | 100% (+12 / +40 / +95 µs) | " \
           "50% (-50 / +1 / +19000 µs) |" in md
    assert "| random-medium | eagle | on | 8 | 5000 | 6000 | 0.833x ±4.0%, costs |" in md
    assert "| llama3-8b-like@8 | eagle | on | 32 | SGLang cannot run this cell: RuntimeError: " \
           "out of memory |" in md
    assert R.ANSWER + (" mtplab decodes at 0.83x to 1.05x SGLang's tok/s over 2 cells (lowest "
                       "0.833x ±4.0%, costs, highest 1.050x ±9.5%, within the noise): faster "
                       "in 0, slower in 1, within the noise in 1; 1 cells did not run; "
                       "mtplab's traces run ahead on 100% to 100% of their steps; SGLang's "
                       "traces run ahead on 50% to 50% of their steps.") in md
    assert "/tmp/x.trace.json" not in json.dumps(doc)          # no machine's paths kept


def test_one_repeat_has_no_verdict_and_a_trace_note_shows():
    rec = _cell("random-medium", 1, [1100.0], [1000.0])
    rec["profile"]["sglang"] = {"trace": None, "note": "no trace was written", "meter": {}}
    md = P.render(P.results_doc([rec], workload=WORKLOAD, command="c"))
    assert "1.100x ±2.0%, one repeat, no verdict" in md
    assert md.rstrip().endswith("| 100% (+12 / +40 / +95 µs) | no trace was written |")


def test_the_stamp_needs_one_clean_commit_and_a_finished_cell():
    two = [_cell("a", 1, [1.0], [1.0]), _cell("a", 8, [1.0], [1.0], commit="def5678")]
    with pytest.raises(ConfigError, match="the cells ran at commits"):
        P.results_doc(two, workload=WORKLOAD, command="c")
    with pytest.raises(ConfigError, match="one commit of a clean tree"):
        P.results_doc([_cell("a", 1, [1.0], [1.0], commit="abc1234-dirty")],
                      workload=WORKLOAD, command="c")
    with pytest.raises(ConfigError, match="set MTP_GIT_COMMIT"):     # a copied tree's cells
        P.results_doc([_cell("a", 1, [1.0], [1.0], commit=None)], workload=WORKLOAD,
                      command="c")
    with pytest.raises(ConfigError, match="no cell of this grid finished"):
        P.results_doc(_records()[2:], workload=WORKLOAD, command="c")


@pytest.mark.parametrize("breakage", ["no_cells", "no_repeats", "no_status"])
def test_a_malformed_results_file_is_one_config_error(tmp_path, capsys, breakage):
    doc = _doc()
    if breakage == "no_cells":
        del doc["cells"]
    elif breakage == "no_repeats":
        doc["cells"][0]["mtplab"]["tok_s_repeats"] = []
    else:
        del doc["cells"][1]["status"]
    with pytest.raises(ConfigError, match="peers results 2026-12-03_h200_abc1234: .*write "
                                          "them again with"):
        P.render(doc)
    d = tmp_path / "peers"
    d.mkdir()
    (d / "2026-12-03_h200_abc1234.json").write_text(json.dumps(doc))
    assert main_report(["peers", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mtplab report: error: peers results")
