"""The `library` and `tiles` phases of question moe_floor. `library` (studies/moe/
moe_library.py): SGLang's fused MoE beside mtplab's grouped kernels. Without a GPU: the
adapter hands SGLang the weights in its documented layout (a stand-in SGLang, written from
0.5.17's fused_topk / fused_experts contract, must reproduce the torch reference), mtplab's
arm (the Triton interpreter) matches the same reference, a missing SGLang is one message
naming the fix, and the report renders both outcomes. `tiles`: each grouped kernel reads its
own launch shape, and the report ranks the shapes timed against the engine's."""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import NamedTuple, Optional

import pytest
import torch
import torch.nn.functional as F

from mtplab.studies import reports as R
from mtplab.studies.moe import moe_floor as floor
from mtplab.studies.moe import moe_library as ml
from mtplab.studies.moe.moe_floor_runner import Log, phase_library


def case(T: int, seed: int, E: int = 8, H: int = 32, inter: int = 16, bias: bool = True):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) / s[-1] ** 0.5   # noqa: E731
    return (r(T, H), r(E, H), r(E) if bias else None, r(E, 2 * inter, H), r(E, H, inter))


def fake_sglang(monkeypatch, calls: list) -> None:
    """A stand-in for SGLang 0.5.17's modules the adapter imports: fused_topk (softmax top-k
    of the logits, renormalised; fp32 weights, int32 ids) and fused_experts (w1 [E, 2I, H]
    with the gate rows first, SiLU-and-mul, w2 [E, H, I], the top-k weighted sum; out of
    place when the config says so)."""
    class StandardTopKOutput(NamedTuple):
        topk_weights: torch.Tensor
        topk_ids: torch.Tensor
        router_logits: torch.Tensor

    @dataclass
    class MoeRunnerConfig:
        num_experts: Optional[int] = None
        num_local_experts: Optional[int] = None
        top_k: Optional[int] = None
        activation: str = "silu"
        inplace: bool = True

    def fused_topk(hidden_states, gating_output, topk, renormalize):
        p = torch.softmax(gating_output.float(), dim=-1)
        w, ids = torch.topk(p, topk, dim=-1)
        if renormalize:
            w = w / w.sum(-1, keepdim=True)
        return w, ids.to(torch.int32)

    published: list = []

    def get_exec():
        if not published:
            raise ValueError("config namespace 'exec' not published")
        return published[-1]

    def publish(server_args, *, role):
        published.append(server_args)

    groups: list = []

    def init_distributed_environment(**kw):
        assert kw["world_size"] == 1 and kw["backend"] == "gloo"
        groups.append("world")

    def initialize_model_parallel(**kw):
        assert kw["tensor_model_parallel_size"] == 1
        groups.append("tp")

    class ServerArgs:
        def __init__(self, model_path: str, device: str):
            self.model_path, self.device = model_path, device

    def fused_experts(hidden_states, w1, w2, topk_output, moe_runner_config):
        get_exec()                         # its config lookup reads the published config
        assert "tp" in groups                # its output buffer is made for the TP group
        w, ids, _ = topk_output
        assert ids.dtype == torch.int32 and not moe_runner_config.inplace
        assert moe_runner_config.num_experts == moe_runner_config.num_local_experts == w1.shape[0]
        calls.append(moe_runner_config)
        out = torch.zeros_like(hidden_states)
        for t in range(hidden_states.shape[0]):
            for j in range(ids.shape[1]):
                e = int(ids[t, j])
                g, u = (w1[e] @ hidden_states[t]).chunk(2)
                out[t] += w[t, j] * (w2[e] @ (F.silu(g) * u))
        return out

    mods = {"sglang": {"__version__": "0.5.17"},
            "sglang.srt": {}, "sglang.srt.layers": {}, "sglang.srt.layers.moe": {},
            "sglang.srt.layers.moe.moe_runner": {"MoeRunnerConfig": MoeRunnerConfig},
            "sglang.srt.layers.moe.moe_runner.triton_utils": {},
            "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe":
                {"fused_experts": fused_experts},
            "sglang.srt.layers.moe.topk": {"StandardTopKOutput": StandardTopKOutput,
                                           "fused_topk": fused_topk},
            "sglang.srt.runtime_context": {"get_exec": get_exec, "publish": publish,
                                           "published": published},
            "sglang.srt.server_args": {"ServerArgs": ServerArgs},
            "sglang.srt.distributed": {},
            "sglang.srt.distributed.parallel_state": {
                "init_distributed_environment": init_distributed_environment,
                "initialize_model_parallel": initialize_model_parallel,
                "model_parallel_is_initialized": lambda: "tp" in groups, "groups": groups}}
    for name, attrs in mods.items():
        m = types.ModuleType(name)
        m.__path__ = []
        m.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, m)


@pytest.mark.parametrize("T,renorm,bias", [(1, True, True), (5, True, False),
                                            (3, False, True)])
def test_the_sglang_adapter_hands_over_the_documented_layout(monkeypatch, T, renorm, bias):
    calls: list = []
    fake_sglang(monkeypatch, calls)
    lib = ml.sglang_routed()
    assert (lib.name, lib.version) == ("SGLang", "0.5.17")
    x, wr, b, wgu, wd = case(T, T, bias=bias)
    out = lib.routed(x, wr, b, wgu, wd, 2, renorm)
    assert ml.rel_err(out, ml.reference(x, wr, b, wgu, wd, 2, renorm)) < 1e-5
    weights, ids = lib.routing(x, wr, b, 2, renorm)                 # its router alone
    assert ml.rel_err(out, ml.reference_on(x, wgu, wd, weights, ids)) < 1e-5
    assert ml.rerouted(ids, ml.reference_routing(x, wr, b, 2, renorm).ids) == 0
    assert [c.top_k for c in calls] == [2]


def test_the_adapter_makes_what_fused_moe_reads_of_a_server_once(monkeypatch):
    """Outside an SGLang server nothing has published the config fused_experts' launch-config
    lookup reads, nor made the tensor-parallel group its output is sized for: the adapter
    makes both, once (a one-rank group); what a process has already is kept."""
    fake_sglang(monkeypatch, [])
    published = sys.modules["sglang.srt.runtime_context"].published
    groups = sys.modules["sglang.srt.distributed.parallel_state"].groups
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: "world" in groups)
    ml.sglang_routed()
    ml.sglang_routed()
    assert [(a.model_path, a.device) for a in published] == [("dummy", "cuda")]
    assert groups == ["world", "tp"]
    published[:] = ["a server's"]
    ml.sglang_routed()
    assert published == ["a server's"] and groups == ["world", "tp"]


@pytest.mark.parametrize("T", [1, 6])
def test_mtplabs_arm_matches_the_same_reference(T):
    x, wr, b, wgu, wd = case(T, 10 + T)
    from mtplab.kernels import moe_route as mr
    counts = torch.zeros(mr.counts_len(T, "cpu"), dtype=torch.int32)
    lib = ml.mtplab_routed(counts)
    out = lib.routed(x, wr, b, wgu, wd, 2, True)
    assert ml.rel_err(out, ml.reference(x, wr, b, wgu, wd, 2, True)) < 1e-5
    weights, ids = lib.routing(x, wr, b, 2, True)
    assert ml.rel_err(out, ml.reference_on(x, wgu, wd, weights, ids)) < 1e-5
    assert not counts.any()


def test_without_sglang_the_phase_records_why_and_how_to_run_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)           # import sglang -> ImportError
    with pytest.raises(ImportError, match="scripts/sglang_h100.sh moe"):
        ml.sglang_routed()
    doc = floor.new_doc(model="gemma4-26b-a4b-like", layers=30, batches=[1], repeats=3,
                        tokens=48, prompt=64)
    log = Log(doc, budget_s=100.0)
    log.phase("library", phase_library, log, reserve_s=0)      # returns before any CUDA work
    assert doc["phases"]["library"]["status"] == "done"
    assert "SGLang's fused MoE does not import" in doc["library"]["unavailable"]
    md = render(doc)
    assert "## library\n\n- not measured: SGLang's fused MoE does not import" in md
    assert "no library MoE kernel measured (it did not import)" in md.split(R.ANSWER)[1]


def render(doc: dict) -> str:
    return floor.render(R.plain(R.stamped(
        doc, date="2026-12-06", device="h200", device_name="NVIDIA H200", commit="abc1234",
        command="python -m benchmarks.bench_moe_floor --only library")))


def test_the_library_section_and_answer_compare_the_arms():
    doc = floor.new_doc(model="gemma4-26b-a4b-like", layers=30, batches=[1], repeats=3,
                        tokens=48, prompt=64)
    doc["bandwidth"] = [4.0e12, 4.1e12, 4.2e12]
    doc["phases"] = {"bandwidth": {"status": "done", "seconds": 0.4},
                     "library": {"status": "done", "seconds": 30.0}}
    doc["library"].update(name="SGLang", version="0.5.17")
    doc["library"]["rows"] = [
        {"T": 1, "mtplab_us": [40.0, 40.4, 40.2], "library_us": [60.0, 60.6, 60.3],
         "mtplab_kernels": 2, "library_kernels": 7, "mtplab_err": 2e-3, "library_err": 3e-3},
        {"T": 32, "mtplab_us": [200.0, 201.0, 200.5], "library_us": [150.0, 150.5, 151.0],
         "mtplab_kernels": 2, "library_kernels": 7, "mtplab_err": 2e-3, "library_err": 4e-3}]
    md = render(doc)
    assert ("| tokens | mtplab µs | mtplab kernels | SGLang µs | SGLang kernels | "
            "SGLang / mtplab | n | mtplab err | SGLang err |") in md
    assert "| 1 | 40.2 | 2 | 60.3 | 7 | 1.500x ±2.0%, pays | 3/3 | 2.0e-03 | 3.0e-03 |" in md
    answer = md.split(R.ANSWER)[1].splitlines()[0]
    assert ("the routed experts SGLang 0.5.17 / mtplab (above 1: mtplab's kernels are the "
            "faster) 1.500x ±2.0% (pays) at T=1, 0.751x ±2.0% (costs) at T=32") in answer
    assert "*Own routing*" not in md                     # a run without those columns
    for r, (own, moved) in zip(doc["library"]["rows"], [(7e-3, 0), (6e-3, 2)]):
        r.update(mtplab_own_err=2e-3, library_own_err=own, mtplab_rerouted=0,
                 library_rerouted=moved)
    md = render(doc)
    assert ("| mtplab err | SGLang err | mtplab err (own routing) | SGLang err (own routing) "
            "| tokens rerouted (mtplab / SGLang) |") in md
    assert "| 2.0e-03 | 4.0e-03 | 2.0e-03 | 6.0e-03 | 0 / 2 |" in md and "*Own routing*" in md


def test_rerouted_counts_the_tokens_whose_expert_set_differs():
    ref = torch.tensor([[3, 1], [0, 2], [5, 4]])
    assert ml.rerouted(torch.tensor([[1, 3], [0, 2], [5, 4]]), ref) == 0    # order is no move
    assert ml.rerouted(torch.tensor([[1, 3], [0, 7], [4, 6]]), ref) == 2


def test_the_tiles_section_ranks_each_kernels_launch_shapes_against_the_engines():
    """Per kernel: the engine's shape first, the others fastest first, a shape that did not
    launch last with its error; vs engine = summed µs ratio; the answer names the fastest
    other shape per kernel."""
    doc = floor.new_doc(model="gemma4-26b-a4b-like", layers=30, batches=[1], repeats=3,
                        tokens=48, prompt=64)
    doc["phases"] = {"tiles": {"status": "done", "seconds": 90.0}}
    eng = dict(BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=4)
    wide = dict(BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)
    big = dict(BLOCK_N=64, BLOCK_K=128, num_warps=8, num_stages=4)
    doc["tiles"] = {"engine": {"gate_up": eng, "down": eng}, "rows": [
        {"kernel": "down", "tile": eng, "us": {"1": 16.0, "8": 30.0}, "err": 2e-3},
        {"kernel": "down", "tile": big, "us": {}, "err": 0.0,
         "error": "OutOfResources: shared memory"},
        {"kernel": "down", "tile": wide, "us": {"1": 12.0, "8": 28.0}, "err": 2e-3},
        {"kernel": "gate_up", "tile": eng, "us": {"1": 25.0, "8": 40.0}, "err": 1e-3}]}
    rows = floor.tile_rows(doc)
    assert [r["name"] for r in rows["down"]] == ["32/128/4/4", "64/64/4/3", "64/128/8/4"]
    assert rows["down"][1]["vs_engine"] == pytest.approx(46.0 / 40.0)
    md = render(doc)
    assert "| down | 32/128/4/4 (engine) | 16.0 | 30.0 | 46.0 | 1.000 | 2.0e-03 |" in md
    assert "| down | 64/64/4/3 | 12.0 | 28.0 | 40.0 | 1.150 | 2.0e-03 |" in md
    assert "| down | 64/128/8/4 | - | - | - | - | OutOfResources: shared memory |" in md
    assert ("the fastest other launch shape of the grouped kernels down 64/64/4/3 1.150x the "
            "engine's") in md.split(R.ANSWER)[1]


def test_the_grouped_kernels_read_their_own_launch_shape(monkeypatch):
    from mtplab.kernels import fused_moe as fm
    monkeypatch.setitem(fm.TILES_16BIT, "down", dict(BLOCK_N=64, BLOCK_K=64, num_warps=8,
                                                     num_stages=3))
    down, gate_up = fm._tiles(torch.bfloat16, "cuda", "down"), fm._tiles(torch.bfloat16,
                                                                           "cuda", "gate_up")
    assert (down["BLOCK_N"], down["BLOCK_K"], down["num_warps"]) == (64, 64, 8)
    assert (gate_up["BLOCK_N"], gate_up["BLOCK_K"], gate_up["num_warps"]) == (32, 128, 4)
    assert down["DOT_PREC"] == gate_up["DOT_PREC"] == "tf32"
    assert fm._tiles(torch.bfloat16, "cpu", "down") == fm._tiles(torch.bfloat16, "cpu",
                                                                 "gate_up")
