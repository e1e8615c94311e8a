"""The decode GEMM plan (models/gemm_plan.py) on CPU, with a stand-in for the device timing:
sites are found on every fused and unfused path, a shape is measured once per process, the
decision keeps cuBLAS on a tie, the launches land on the modules whose weights chose them,
and a CPU / fp32 / deterministic / `cublas` run plans nothing."""
from __future__ import annotations

import pytest
import torch

from mtplab.config import DECODE_GEMMS as CONFIG_GEMMS
from mtplab.config import RunConfig
from mtplab.errors import ConfigError
from mtplab.models import gemm_plan as P
from mtplab.models.linear import NO_PLAN, Linear
from mtplab.models.llama import LlamaForCausalLM
from mtplab.models.llama_config import LlamaConfig

FAST = P.CANDIDATES[1]


def tiny(fused=True) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).set_fused(fused)


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.setattr(P, "_CACHE", {})


def fake_measure(triton_wins: set, calls: list):
    """Triton (FAST) 2x faster than cuBLAS on the shapes (N, K) in triton_wins, 1.01x
    (inside the margin) elsewhere."""
    def measure(weights, rope=None):
        n, k = weights[0].shape
        calls.append((n, k, len(weights)))
        faster = 2.0 if (n, k) in triton_wins else 1.01
        return {None: 10.0, P.CANDIDATES[0]: 10.0, FAST: 10.0 / faster}
    return measure


def test_config_and_plan_name_the_same_modes():
    assert CONFIG_GEMMS == P.DECODE_GEMMS
    with pytest.raises(ConfigError, match="decode_gemm='cutlass' is unknown"):
        RunConfig(decode_gemm="cutlass").validate()


def test_sites_of_the_fused_and_unfused_paths():
    names = {(type(m).__name__, s, tuple(w.shape)) for m, s, w in P.sites(tiny(True))}
    assert ("Attention", "qkv", (64, 32)) in names          # q 32 + k 16 + v 16 rows
    assert ("MLP", "gate_up", (96, 32)) in names
    assert ("Linear", "weight", (32, 48)) in names          # down_proj
    assert ("Linear", "weight", (80, 32)) in names          # lm_head
    assert ("Linear", "weight", (16, 32)) not in names      # k_proj: read through qkv
    assert len(names) == 5                                   # + o_proj (32, 32)
    unfused = [(s, tuple(w.shape)) for _, s, w in P.sites(tiny(False))]
    assert len(unfused) == 2 * 7 + 1                         # q/k/v/o, gate/up/down; lm_head
    assert {s for s, _ in unfused} == {"weight"}


def test_choose_keeps_cublas_on_a_tie():
    assert P.choose({None: 10.0, FAST: 5.0}) == (FAST, 5.0)
    assert P.choose({None: 10.0, FAST: 9.9})[0] is None              # within MARGIN
    assert P.choose({None: 10.0, FAST: 12.0, P.CANDIDATES[0]: 9.0}) == (P.CANDIDATES[0], 9.0)


def test_plan_measures_each_shape_once_and_sets_the_sites():
    model, calls = tiny(), []
    wins = {(64, 32), (80, 32)}                              # qkv and the LM head
    choices = P.plan(model, measure=fake_measure(wins, calls))
    shapes = {(c.n, c.k) for c in choices}
    assert len(calls) == len(shapes) == len({(n, k) for n, k, _ in calls})
    assert {(c.n, c.k) for c in choices if c.launch is not None} == wins
    by_shape = {(c.n, c.k): c for c in choices}
    assert by_shape[(64, 32)].sites == 2 and by_shape[(64, 32)].launch == FAST   # 2 layers
    for layer in model.model.layers:
        assert layer.self_attn.gemv == {"qkv": FAST}
        assert layer.mlp.gemv is NO_PLAN and layer.self_attn.o_proj.gemv is NO_PLAN
    assert model.lm_head.gemv == {"weight": FAST}
    P.plan(tiny(), measure=fake_measure(set(), calls))       # cached: measured no more
    assert len(calls) == len(shapes)
    row = by_shape[(80, 32)].row()
    assert row["launch"] == P.label(FAST) and row["cublas_us"] == 10.0


def test_a_shape_out_of_memory_stays_on_cublas_uncached():
    def oom(weights, rope=None):
        raise torch.OutOfMemoryError("CUDA out of memory")
    model = tiny()
    choices = P.plan(model, measure=oom)
    assert all(c.launch is None for c in choices) and not P._CACHE
    assert model.lm_head.gemv is NO_PLAN


def test_clear_and_the_runs_that_plan_nothing():
    model, calls = tiny(), []
    P.plan(model, measure=fake_measure({(80, 32)}, calls))
    assert model.lm_head.gemv
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert P.apply("auto", [model], cpu, torch.float32, False) == []
    assert model.lm_head.gemv is NO_PLAN
    assert P.applies("auto", cuda, torch.bfloat16, False)
    for args in (("cublas", cuda, torch.bfloat16, False), ("auto", cuda, torch.float32, False),
                 ("auto", cuda, torch.bfloat16, True), ("auto", cpu, torch.bfloat16, False)):
        assert not P.applies(*args)


def test_a_planned_site_off_cuda_computes_f_linear():
    """A launch on a CPU module changes nothing (gemv.linear runs F.linear off CUDA)."""
    lin = Linear(16, 8, bias=False)
    x = torch.randn(3, 16)
    ref = lin(x)
    lin.gemv = {"weight": FAST}
    assert torch.equal(lin(x), ref)
    assert Linear(16, 8, bias=True).gemm_sites() == {}       # a bias stays on F.linear


def test_the_rotation_reads_distinct_weights_up_to_its_bounds(monkeypatch):
    ws = [torch.zeros(4, 8) for _ in range(3)]
    rot = P._rotation(ws + ws[:1])                          # a weight twice counts once
    assert len(rot) == P.ROTATE_MAX and len({w.data_ptr() for w in rot}) == P.ROTATE_MAX
    monkeypatch.setattr(P, "ROTATE_BYTES", 5 * 4 * 8 * 4)   # five weights' bytes
    assert len(P._rotation(ws)) == 5


def test_a_cpu_engine_plans_nothing_and_keeps_its_plan_after_close():
    from mtplab import Engine
    with Engine(RunConfig(model="random-tiny", device="cpu", draft="frozen_kv_mtp")) as eng:
        assert eng.gemm_plan == []
        assert all(m.gemv is NO_PLAN for m, _, _ in P.sites(eng.model, eng.draft_model))
        eng.check_invariants()
    assert eng.gemm_plan == []


def test_a_launch_that_fails_is_left_out_and_cublas_failing_is_raised(monkeypatch, caplog):
    """measure() on a stand-in device: each arm's pass over the rotation runs once (graph_us
    replaced); the second candidate raises as a launch out of shared memory would, and is left
    out with one warning; the rest are timed. A shape where every launch fails keeps cuBLAS."""
    import logging
    bad = P.CANDIDATES[1]

    def gemv(x, w, c):
        if c == bad:
            raise RuntimeError("out of resource: shared memory")
        return torch.nn.functional.linear(x, w)

    def graph_us(fn, reps, replays):
        fn()
        return 8.0
    monkeypatch.setattr(P, "_gemv_triton", gemv)
    monkeypatch.setattr(P, "graph_us", graph_us)
    monkeypatch.setattr(P, "ROTATE_MAX", 2)
    w = torch.zeros(16, 32)
    with caplog.at_level(logging.WARNING, logger="mtplab"):
        us = P.measure([w])
    assert bad not in us and set(us) == {None, *P.CANDIDATES} - {bad}
    assert us[None] == pytest.approx(2 * 8.0 / 2)          # two row counts, two weights
    assert sum("is left out" in r.message for r in caplog.records) == 1
    assert P.choose({None: 3.0}) == (None, pytest.approx(float("nan"), nan_ok=True))
    monkeypatch.setattr(P, "_gemv_triton", lambda *a: 1 / 0)        # every launch fails
    model = tiny()
    choices = P.plan(model)
    assert all(c.launch is None for c in choices) and model.lm_head.gemv is NO_PLAN
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        P.measure([w])


def test_a_rope_site_is_its_own_shape_timed_with_its_epilogue():
    """The fused qkv site carries its heads: measured with them, apart from a plain weight of
    the same shape, and its row names the epilogue."""
    from mtplab.kernels.qkv_rope import RopeShape
    model, seen = tiny(), []

    def measure(weights, rope=None):
        seen.append((tuple(weights[0].shape), rope))
        return {None: 10.0, FAST: 5.0}
    model.lm_head.weight = torch.nn.Parameter(torch.zeros(64, 32))   # qkv's shape, plain
    choices = P.plan(model, measure=measure)
    assert ((64, 32), RopeShape(4, 2, 8)) in seen and ((64, 32), None) in seen
    rows = {(c.n, c.k, c.rope): c.row() for c in choices}
    assert rows[(64, 32, RopeShape(4, 2, 8))]["epilogue"] == "rope"
    assert rows[(64, 32, None)]["epilogue"] is None and rows[(64, 32, None)]["sites"] == 1
    assert model.model.layers[0].self_attn.gemv == {"qkv": FAST}


def test_measure_with_rope_times_cublas_then_rope_against_the_fused_launches(monkeypatch):
    """On a stand-in device (graph_us runs each arm's pass once): the cuBLAS arm runs the
    GEMM then rope_qkv_cache, each fused arm the qkv_rope kernel at a launch that fits."""
    from mtplab.kernels import qkv_rope as QR
    ran = []
    monkeypatch.setattr(P, "rope_qkv_cache", lambda qkv, *a: ran.append("rope") or
                        QR.rope_qkv_cache_ref(qkv, *a))
    monkeypatch.setattr(P, "_qkv_rope_triton", lambda x, w, c, *a: ran.append(c) or
                        QR.qkv_rope_ref(x, w, c, *a))
    monkeypatch.setattr(P, "graph_us", lambda fn, reps, replays: fn() and 4.0)
    monkeypatch.setattr(P, "ROTATE_MAX", 1)
    rope = QR.RopeShape(nq=2, nkv=1, head_dim=64)
    us = P.measure([torch.zeros(4 * 64, 16)], rope)
    fitting = [c for c in P.CANDIDATES if QR.fits(c, rope)]
    assert fitting and len(fitting) < len(P.CANDIDATES)
    assert set(us) == {None, *fitting}
    assert ran.count("rope") == len(P.PLAN_ROWS) and set(ran) - {"rope"} == set(fitting)
