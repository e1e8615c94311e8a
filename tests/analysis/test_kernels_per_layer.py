"""Kernels per decoder layer from a trace (mtplab/analysis/kernels.py): the repeating block of
the target forward's kernel names, on planted sequences, a planted Kineto trace through the
sweep's trace_metrics, and the real H100 trace."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from mtplab.analysis.kernels import layer_block, per_layer, per_window
from mtplab.analysis.trace_io import load_trace
from mtplab.sweep.metrics import trace_metrics
from tests.helpers import Synth

REAL = Path(__file__).resolve().parents[1] / "data" / "gpu_frozen_overlap.pt.trace.json.gz"
PRO, EPI = [100, 101, 102], [103, 104, 105, 106]     # names no layer launches


def forward(block: list, layers: int, first: list | None = None) -> list:
    """prologue, the layer block `layers` times (the first one `first` when given), epilogue."""
    return PRO + (first or block) + block * (layers - 1) + EPI


BLOCK = [1, 2, 3, 4, 5, 1, 6, 7, 8]        # norm, qkv, rope, attn, o, norm, gate_up, silu, down


def test_the_block_of_identical_layers_is_found():
    assert layer_block(forward(BLOCK, 5), 5) == (9, 5)
    assert layer_block(forward(BLOCK, 32), 32) == (9, 32)


def test_a_first_layer_that_differs_leaves_l_minus_1_repetitions():
    assert layer_block(forward(BLOCK, 5, first=[9] + BLOCK[1:]), 5) == (9, 4)


def test_a_block_with_an_inner_period_is_the_whole_layer():
    # [1, 2, 1, 2] repeats 2L times as [1, 2]: more than L, so the 4-block is the layer
    assert layer_block(forward([1, 2, 1, 2], 3), 3) == (4, 3)


def test_a_per_layer_copy_loop_does_not_beat_the_layers():
    seq = forward(BLOCK, 4) + [50] * 4 + [51]        # e.g. a commit copying once per layer
    assert layer_block(seq, 4) == (9, 4)


@pytest.mark.parametrize("seq,layers", [
    (forward(BLOCK, 4)[:-len(EPI)] + [9] + EPI, 1),                 # one layer: nothing repeats
    (PRO + BLOCK + BLOCK[:4] + [60] + BLOCK[4:] + BLOCK * 2 + EPI, 4),  # layers differ
    (forward(BLOCK, 4), 6),                           # the wrong depth: 4 < 6 - 1 repetitions
    ([], 4),
])
def test_no_block_where_the_layers_do_not_repeat(seq, layers):
    assert layer_block(seq, layers) == (0, 0)


def test_random_blocks_and_depths():
    rng = np.random.default_rng(0)
    for _ in range(200):
        k, L = int(rng.integers(3, 40)), int(rng.integers(2, 48))
        block = rng.integers(0, 12, k).tolist()
        block[0] = 99                                 # no inner period
        pro, epi = rng.integers(200, 300, 5).tolist(), rng.integers(300, 400, 9).tolist()
        assert layer_block(pro + block * L + epi, L) == (k, L), (k, L)


def planted(layers: int, *, odd_layer: int | None = None, steps: int = 3) -> Synth:
    """Decode steps of a spec engine: a draft graph (4 one-layer draft forwards of 12 kernels:
    periodic too, and covering more kernels than the target's layers when L = 4), then the
    verify graph (the target forward: prologue, `layers` x 9 kernels, the first layer's norm a
    different kernel, epilogue) with a D2H copy on another stream in the middle of its layers;
    `odd_layer`: that layer launches one kernel more."""
    s = Synth()
    for k in range(steps):
        t0 = 2000.0 * k
        s.host("step[decode bs=1]", t0, 2000)
        g = s.launch(t0 + 10, "cudaGraphLaunch", 5)
        t = start = t0 + 20
        for _ in range(4):
            for n in [100] + BLOCK + [104, 105]:
                s.gpu(g, t, 1.0, name=f"k{n}")
                t += 2
        s.gpu_ann("draft", start, t - start)
        g = s.launch(t0 + 20, "cudaGraphLaunch", 5)
        seq = [9] + BLOCK[1:] + BLOCK * (layers - 1)
        if odd_layer is not None:
            at = 9 * odd_layer + 4
            seq = seq[:at] + [60] + seq[at:]
        start = t
        for n in PRO + seq + EPI:
            s.gpu(g, t, 1.0, name=f"k{n}")
            t += 2
        s.gpu_ann("verify", start, t - start)
        s.gpu(s.launch(t0 + 30, "cudaMemcpyAsync"), start + 2 * (len(PRO) + 18) + 1, 0.5,
              stream=20, cat="gpu_memcpy", name="Memcpy DtoH")
    return s


@pytest.mark.parametrize("L", [4, 6])
def test_trace_metrics_reads_the_planted_layers(tmp_path, L):
    path = planted(L).write(tmp_path / "t.pt.trace.json.gz", gz=True)
    m = trace_metrics(str(path), 0, layers=L)
    assert m["kernels_per_layer"] == 9.0
    per_step = 4 * 12 + len(PRO) + 9 * L + len(EPI) + 1    # the copy stream's memcpy counts
    assert m["kernels_per_step"] == per_step
    assert math.isnan(trace_metrics(str(path), 0)["kernels_per_layer"])   # depth unknown
    assert math.isnan(trace_metrics(str(path), 0, layers=L + 2)["kernels_per_layer"])
    tr = load_trace(path)
    assert per_layer(tr, [0.0], [1.0], L).size == 0          # no verify span in the window
    w0 = np.array([tr.ts.min(), tr.ts.min() + 2000])
    assert per_window(tr, w0, w0 + 2000).tolist() == [per_step, per_step]


def test_layers_that_launch_different_kernels_give_nan(tmp_path):
    path = planted(4, odd_layer=2).write(tmp_path / "t.pt.trace.json.gz", gz=True)
    m = trace_metrics(str(path), 0, layers=4)
    assert math.isnan(m["kernels_per_layer"]) and m["kernels_per_step"] > 0


def test_real_h100_trace_has_one_attention_kernel_per_layer_block():
    """tiny-code (6 layers), the unfused engine of the time: 49 GPU activities per layer, and
    independently of the block search, the verify's six attention kernels are 49 apart."""
    m = trace_metrics(str(REAL), 0, layers=6)
    assert m["kernels_per_layer"] == 49.0
    tr = load_trace(REAL)
    v = next(i for i in np.flatnonzero(tr.cat_mask("gpu_user_annotation"))
             if tr.name_of(i) == "verify")
    a = np.flatnonzero(tr.cat_mask("kernel", "gpu_memcpy", "gpu_memset") & (tr.tid == tr.tid[v])
                       & (tr.ts >= tr.ts[v]) & (tr.ts <= tr.ts[v] + tr.dur[v]))
    a = a[np.argsort(tr.ts[a], kind="stable")]
    assert layer_block(tr.name[a], 6) == (49, 6)
    attn = [j for j, i in enumerate(a) if tr.name_of(i) == "_extend_kernel"]
    assert len(attn) == 6 and set(np.diff(attn).tolist()) == {49}


ONE_CELL = """
timeout_s: 300
base: {model: random-tiny, device: cpu, prompt_len_tokens: 16, output_len_tokens: 6,
       warmup_output_len_tokens: 2, profile: true, profile_wait: 1, profile_warmup: 1,
       profile_active: 2}
grid: {repeat: [0], batch_size: [2]}
arms: [{overlap: false}]
"""


def test_bench_on_cpu_has_the_column_and_the_trace_has_the_layers(tmp_path):
    """`mtplab bench` on CPU, one cell: the kernels/layer column is there and, like
    kernels/step, "-" (a CPU trace has no GPU activities). The same block search over the
    host's aten ops of the cell's trace finds the 4 layers of random-tiny, and independently
    the verify's linears (all but the LM head's, per layer) start a layer every block."""
    import pandas as pd

    from mtplab.studies.bench import main_bench
    from mtplab.sweep import RESULTS_PARQUET

    grid = tmp_path / "one.yaml"
    grid.write_text(ONE_CELL)
    out = tmp_path / "bench.md"
    assert main_bench(["--groups", str(grid), "--device", "cpu", "--dir", str(tmp_path / "b"),
                       "--out", str(out), "--no-progress"]) == 0
    lines = [ln for ln in out.read_text().splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    row = [c.strip() for c in lines[1].strip("|").split("|")]
    assert row[head.index("kernels/layer")] == "-" == row[head.index("kernels/step")]
    df = pd.read_parquet(tmp_path / "b" / "one" / RESULTS_PARQUET)
    assert (df["status"] == "ok").all() and "kernels_per_layer" in df
    assert df["kernels_per_layer"].isna().all() and df["kernels_per_step"].isna().all()

    tr = load_trace(df["trace_path"].iloc[0])
    L = 4
    blocks = per_layer(tr, [tr.ts.min()], [tr.end.max() + 1], L, cats=("cpu_op",),
                       annotation="user_annotation")
    assert blocks.size == 2 and np.isfinite(blocks).all() and blocks[0] == blocks[1]
    k = int(blocks[0])
    v = next(i for i in np.flatnonzero(tr.cat_mask("user_annotation"))
             if tr.name_of(i) == "verify")
    ops = np.flatnonzero(tr.cat_mask("cpu_op") & (tr.tid == tr.tid[v]) & (tr.ts >= tr.ts[v])
                         & (tr.ts <= tr.ts[v] + tr.dur[v]))
    ops = ops[np.argsort(tr.ts[ops], kind="stable")]
    lin = [j for j, i in enumerate(ops) if tr.name_of(i) == "aten::linear"]
    per = (len(lin) - 1) // L                           # the LM head is the last one
    assert per >= 2 and len(lin) == per * L + 1
    assert set(np.diff(lin[:-1:per]).tolist()) == {k}


def test_the_block_equals_the_two_depth_difference_on_cpu_ops():
    """The two ways of counting per layer agree on a real forward (the host's aten ops on CPU
    stand in for GPU activities): bench_kernels' (k(L) - k(L/2)) / (L - L/2) and the block
    that repeats in the full-depth forward, fused (the first layer's norm differs: L - 1
    repetitions) and unfused."""
    from mtplab.studies.decode_floor.kernel_figures import layer_counts
    from mtplab import Engine, RunConfig

    eng = Engine(RunConfig(model="random-tiny", device="cpu", max_running_requests=1))
    got = layer_counts(eng, cats=("cpu_op",))
    for fused, (per, outside, (k, _reps), _) in got.items():
        assert k > 0 and per == k and outside > 0, (fused, per, k)
    assert got[True][2][1] == 3 and got[False][2][1] == 4
    assert got[True][0] != got[False][0]
