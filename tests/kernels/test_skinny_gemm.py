"""The skinny GEMM (kernels/skinny_gemm.py) vs its torch reference under the interpreter
(CPU, small shapes; tests/gpu/test_skinny_gemm_gpu.py runs it compiled), its launch plan, the
`linear` switch of the model's fused path, and the RunConfig rules of the knob."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mtplab import RunConfig
from mtplab.errors import ConfigError
from mtplab.kernels import skinny_gemm as sg
from mtplab.models.zoo import build_target

# fp32: K-order differences only; bf16: the output's rounding (a few ulps of |y| ~ sqrt(K))
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-5), torch.bfloat16: dict(atol=0.25, rtol=2e-2)}
PART = 1 << 16


def rnd(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def cfg(N, K, dtype, splits):
    return sg.plan(N, K, dtype, 4, block_k=64, splits=splits, part_floats=PART)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("silu_mul", [False, True])
def test_kernel_matches_reference(dtype, M, splits, silu_mul):
    """N and K are not multiples of the tiles: the masked edges are exercised."""
    N, K = 80, 300
    x = rnd(M, 2 * K if silu_mul else K, dtype=dtype, seed=M)
    w = rnd(N, K, dtype=dtype, seed=7) / 8
    ws = sg.Workspace("cpu", part_floats=PART)
    ws.part.fill_(float("nan"))        # a partial read before it is written shows
    p = cfg(N, K, dtype, splits)
    assert p.splits == splits
    got = sg.skinny_gemm_triton(x, w, ws, silu_mul=silu_mul, config=p)
    want = (sg.linear_silu_mul_ref if silu_mul else sg.linear_ref)(x, w)
    assert got.dtype == dtype and got.shape == (M, N)
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    assert not ws.count.any()          # every launch leaves its counters at 0


def test_split_k_reduces_in_a_fixed_order():
    """The last program of a tile sums the partials in split order: the same bits on every
    launch and for every order the programs finish in; and a split plan computes what the
    one-split plan computes up to fp32 reassociation."""
    x, w = rnd(4, 512), rnd(48, 512, seed=1)
    ws = sg.Workspace("cpu", part_floats=PART)
    a = sg.skinny_gemm_triton(x, w, ws, config=cfg(48, 512, torch.float32, 4))
    b = sg.skinny_gemm_triton(x, w, ws, config=cfg(48, 512, torch.float32, 4))
    one = sg.skinny_gemm_triton(x, w, None, config=cfg(48, 512, torch.float32, 1))
    assert torch.equal(a, b)
    torch.testing.assert_close(a, one, atol=1e-4, rtol=1e-5)


def test_a_row_is_the_same_at_any_m():
    """The plan never depends on M: row r of an 8-row launch has the bits of a 1-row one."""
    x, w = rnd(8, 256, dtype=torch.bfloat16), rnd(40, 256, dtype=torch.bfloat16, seed=1)
    ws = sg.Workspace("cpu", part_floats=PART)
    full = sg.skinny_gemm_triton(x, w, ws, config=cfg(40, 256, torch.bfloat16, 2))
    for r in (0, 5, 7):
        one = sg.skinny_gemm_triton(x[r:r + 1], w, ws, config=cfg(40, 256, torch.bfloat16, 2))
        assert torch.equal(one, full[r:r + 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_rounds_as_the_fused_op(dtype):
    """The down projection's input is fused_ops.silu_mul's value, bit for bit: the kernel
    with silu_mul=True equals the kernel over the silu_mul kernel's output."""
    from mtplab.kernels.fused_ops import silu_mul_triton
    K = 128
    gu, w = rnd(3, 2 * K, dtype=dtype), rnd(32, K, dtype=dtype, seed=1)
    p = cfg(32, K, dtype, 1)
    got = sg.skinny_gemm_triton(gu, w, None, silu_mul=True, config=p)
    assert torch.equal(got, sg.skinny_gemm_triton(silu_mul_triton(gu), w, None, config=p))


def test_bad_shapes_are_refused():
    w = rnd(16, 64)
    with pytest.raises(ValueError, match="M <= 8"):
        sg.skinny_gemm_triton(rnd(9, 64), w)
    with pytest.raises(ValueError, match="matching K"):
        sg.skinny_gemm_triton(rnd(2, 64), w, silu_mul=True)
    with pytest.raises(ValueError, match="Workspace"):
        sg.skinny_gemm_triton(rnd(2, 256), rnd(16, 256), None,
                              config=cfg(16, 256, torch.float32, 2))


# -- the launch plan --------------------------------------------------------------------
LLAMA3_8B = {"q/o": (4096, 4096), "k/v": (1024, 4096), "qkv": (6144, 4096),
             "gate_up": (28672, 4096), "down": (4096, 14336), "lm_head": (128256, 4096)}


@pytest.mark.parametrize("name", list(LLAMA3_8B))
def test_plan_covers_k_and_fills_the_device(name):
    N, K = LLAMA3_8B[name]
    p = sg.plan(N, K, torch.bfloat16, 132)
    assert p.k_split % p.block_k == 0
    assert (p.splits - 1) * p.k_split < K <= p.splits * p.k_split    # every split has work
    programs = -(-N // p.block_n) * p.splits
    assert programs >= 2 * 132 or p.splits == 16 or p.k_split <= 4 * p.block_k
    assert p.splits * sg.BLOCK_M * N <= sg.PART_FLOATS


def test_plan_splits_only_narrow_weights():
    assert sg.plan(128256, 4096, torch.bfloat16, 132).splits == 1        # LM head
    assert sg.plan(28672, 4096, torch.bfloat16, 132).splits == 1         # gate/up
    assert sg.plan(4096, 14336, torch.bfloat16, 132).splits > 1          # down
    assert sg.plan(4096, 4096, torch.bfloat16, 132).splits > 1           # o
    tight = sg.plan(4096, 14336, torch.bfloat16, 132, part_floats=2 * sg.BLOCK_M * 4096)
    assert tight.splits == 2                                             # the workspace caps it


# -- the model's switch -----------------------------------------------------------------
@pytest.fixture
def spy(monkeypatch):
    calls = []
    real = sg.skinny_gemm_triton

    def counted(x, w, ws=None, silu_mul=False, config=None):
        calls.append((tuple(x.shape), tuple(w.shape), silu_mul))
        return real(x, w, ws, silu_mul=silu_mul, config=config)
    monkeypatch.setattr(sg, "skinny_gemm_triton", counted)
    return calls


def test_linear_is_f_linear_outside_the_scope_and_above_max_m(spy):
    w = rnd(24, 64)
    for x in (rnd(3, 64), rnd(9, 64)):
        assert torch.equal(sg.linear(x, w), F.linear(x, w))
    with sg.using(sg.Workspace("cpu", part_floats=PART)):
        assert torch.equal(sg.linear(rnd(9, 64), w), F.linear(rnd(9, 64), w))
        assert not spy
        torch.testing.assert_close(sg.linear(rnd(3, 64), w), F.linear(rnd(3, 64), w),
                                   **TOL[torch.float32])
    assert spy == [((3, 64), (24, 64), False)]
    with sg.using(None):                    # the engine's scope with the knob off
        sg.linear(rnd(3, 64), w)
    assert len(spy) == 1


def test_the_fused_model_runs_every_gemm_through_the_kernel(spy):
    """random-tiny's fused forward at T = 2 tokens: q/k/v, o, gate/up, down (with SiLU * up)
    per layer and the LM head all run the kernel, and the logits match the cuBLAS path."""
    from mtplab.kernels.attention_ref import paged_attention_ref
    from mtplab.kernels.attn_meta import AttnMeta
    torch.manual_seed(0)
    model, _ = build_target("random-tiny", 0, "cpu", torch.float32)
    model.set_fused(True)
    c = model.config
    L, nkv, d = c.num_hidden_layers, c.num_key_value_heads, c.head_dim
    T = 2
    kv = [torch.zeros(L, 8, nkv, d) for _ in range(2)]
    ids, pos, loc = torch.tensor([5, 9]), torch.tensor([0, 1]), torch.tensor([0, 1])
    meta = AttnMeta(table=torch.arange(8, dtype=torch.int32)[None], rows=torch.tensor([0]),
                    kv_lens=torch.tensor([T]), q_lens=torch.tensor([T]), cu_q=torch.tensor([0, T]),
                    positions=pos, max_q=T, max_kv=T)
    with torch.no_grad():
        want = model(ids, pos, *[k.clone() for k in kv], loc, meta, paged_attention_ref)
        with sg.using(sg.Workspace("cpu", part_floats=PART)):
            got = model(ids, pos, *[k.clone() for k in kv], loc, meta, paged_attention_ref)
    torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    H, I, V = c.hidden_size, c.intermediate_size, c.vocab_size
    qkv = (c.num_attention_heads + 2 * nkv) * d
    layer = [((T, H), (qkv, H), False), ((T, c.num_attention_heads * d), (H, H), False),
             ((T, H), (2 * I, H), False), ((T, 2 * I), (H, I), True)]
    assert spy == layer * L + [((T, H), (V, H), False)]


# -- RunConfig ---------------------------------------------------------------------------
def test_runconfig_rules():
    assert RunConfig(device="cpu").skinny_gemm is False
    assert RunConfig(device="cpu", fused=True, skinny_gemm=True).skinny_gemm
    with pytest.raises(ConfigError, match="needs fused=True"):
        RunConfig(device="cpu", skinny_gemm=True)
    with pytest.raises(ConfigError, match="exclude each other"):
        RunConfig(device="cpu", fused=True, skinny_gemm=True, deterministic=True,
                  attention_backend="triton")


def test_runconfig_on_cpu_needs_the_interpreter(monkeypatch):
    from mtplab import lazy_triton
    monkeypatch.setattr(lazy_triton, "interpreting", lambda: False)
    with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
        RunConfig(device="cpu", fused=True, skinny_gemm=True)


# -- through the engine (CPU: the interpreter) --------------------------------------------
def generate(**kw):
    from mtplab import Engine
    from tests.helpers import make_agreeable, random_prompts
    eng = Engine(RunConfig(device="cpu", model="random-tiny", context_len=128, fused=True,
                           page_size=4, **kw))
    make_agreeable(eng)
    out = eng.generate(random_prompts(3, [1, 7, 20], 320, seed=3), max_new_tokens=8,
                       ignore_eos=True)
    eng.check_invariants()
    return eng, out


@pytest.mark.slow
def test_engine_greedy_spec_equals_target_only_with_the_kernel(spy):
    """fp32: target-only with the kernel == without it, and Frozen-KV MTP with the kernel
    (decode M = batch, verify M = batch x 4 rows: kernel and cuBLAS mixed) == target-only."""
    _, plain = generate()
    assert not spy
    _, target = generate(skinny_gemm=True)
    assert spy and target == plain
    eng, spec = generate(skinny_gemm=True, draft="frozen_kv_mtp", overlap=True)
    assert spec == plain and eng.stats()["accept_len"] > 1.5
