"""Programmatic dependent launch (kernels/pdl.py), compiled ahead of time for an H100 (the
interpreter has no grid dependency control): the skinny GEMM launched with it loads only
weights and stores nothing before its gdc_wait; the kernels before a GEMM trigger at entry;
PDL=False leaves no GDC instruction; off the GPU and inside `off()` nothing asks for it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from mtplab.kernels import pdl

_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import importlib
mod, name, sig, const = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
k = getattr(importlib.import_module(mod), name).real()
sig.update({c: "constexpr" for c in const})
src = ASTSource(fn=k, signature=sig, constexprs=const)
print(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"])
"""


def sm90_ptx(tmp_path, module: str, kernel: str, sig: dict, const: dict) -> list[str]:
    """PTX lines of `module.kernel` compiled ahead of time for an H100, in a fresh process
    without TRITON_INTERPRET (this process's Triton library functions are interpreted)."""
    pytest.importorskip("triton")
    from triton.backends import backends
    if "nvidia" not in backends:
        pytest.skip("this Triton install has no CUDA backend.")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-c", _COMPILE, module, kernel, json.dumps(sig),
                          json.dumps(const)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return [ln.strip() for ln in out.stdout.splitlines()]

GEMV_SIG = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "P": "*fp32", "M": "i32", "N": "i32",
            "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32",
            "k_per": "i32"}


def _gemv_ptx(tmp_path, on: bool, split: int = 1) -> list[str]:
    const = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, SPLIT_K=split, UPCAST=False, PDL=on)
    return sm90_ptx(tmp_path, "mtplab.kernels.gemv", "_gemv_kernel", GEMV_SIG, const)


def test_a_gemm_split_over_k_triggers_at_entry_and_its_reduce_waits_at_entry(tmp_path):
    lines = _gemv_ptx(tmp_path, True, split=2)
    trig = [i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.launch")]
    assert len(trig) == 1 and trig[0] < min(i for i, ln in enumerate(lines)
                                            if re.search(r"\bld\.global", ln))
    assert not any(ln.startswith("griddepcontrol.launch") for ln in _gemv_ptx(tmp_path, True))
    sig = {"P": "*fp32", "Y": "*bf16", "M": "i32", "N": "i32", "stride_ym": "i32"}
    for on in (True, False):
        red = sm90_ptx(tmp_path, "mtplab.kernels.gemv", "_gemv_reduce_kernel", sig,
                       dict(BLOCK_M=16, BLOCK_N=32, SPLIT_K=2, PDL=on))
        waits = [i for i, ln in enumerate(red) if ln.startswith("griddepcontrol.wait")]
        assert len(waits) == on
        if on:
            assert waits[0] < min(i for i, ln in enumerate(red)
                                  if re.search(r"\b(ld|st)\.global", ln))


def test_the_gemm_waits_before_it_reads_x_or_stores(tmp_path):
    lines = _gemv_ptx(tmp_path, True)
    waits = [i for i, ln in enumerate(lines) if ln.startswith("griddepcontrol.wait")]
    assert len(waits) == 1
    before = lines[:waits[0]]
    assert not any(re.search(r"\b(st|atom|red)\.global", ln) for ln in before)
    # the first tile of w is loaded before the wait, x after it: loads on both sides
    assert any(re.search(r"\bld\.global", ln) for ln in before)
    assert any(re.search(r"\bld\.global", ln) for ln in lines[waits[0]:])
    assert not any("griddepcontrol" in ln for ln in _gemv_ptx(tmp_path, False))


@pytest.mark.parametrize("name", ["add_rmsnorm", "silu_mul", "split_reduce"])
def test_the_kernels_before_a_gemm_trigger_at_entry(tmp_path, name):
    kernel, sig, const = {
        "add_rmsnorm": (("fused_ops", "_add_rmsnorm_kernel"),
                        {"X": "*bf16", "R": "*bf16", "W": "*bf16", "Y": "*bf16", "RO": "*bf16",
                         "stride_x": "i32", "stride_r": "i32", "stride_y": "i32",
                         "stride_ro": "i32", "N": "i32", "eps": "fp32"},
                        dict(HAS_RES=True, BLOCK=4096)),
        "silu_mul": (("fused_ops", "_silu_mul_kernel"),
                     {"GU": "*bf16", "O": "*bf16", "stride_g": "i32", "stride_o": "i32",
                      "I": "i32"}, dict(BLOCK=1024)),
        "split_reduce": (("triton_attention", "_split_reduce_kernel"),
                         {"Part": "*fp32", "ML": "*fp32", "O": "*bf16", "QLens": "*i32",
                          "CuQ": "*i64", "num_parts": "i32", "stride_pt": "i32",
                          "stride_ph": "i32", "stride_ps": "i32", "stride_lt": "i32",
                          "stride_lh": "i32", "stride_ls": "i32", "stride_ot": "i32",
                          "stride_oh": "i32"}, dict(BLOCK_S=16, HEAD_D=128)),
    }[name]
    for on in (True, False):
        body = sm90_ptx(tmp_path, f"mtplab.kernels.{kernel[0]}", kernel[1], sig,
                        dict(const, PDL=on))
        trig = [i for i, ln in enumerate(body) if ln.startswith("griddepcontrol.launch")]
        assert len(trig) == on
        if on:          # at entry: before the kernel's first load
            first_ld = next(i for i, ln in enumerate(body) if re.search(r"\bld\.global", ln))
            assert trig[0] < first_ld
        assert not any(ln.startswith("griddepcontrol.wait") for ln in body)


def test_enabled_only_on_a_cuda_device_and_outside_off(monkeypatch):
    assert not pdl.enabled(torch.zeros(1))
    monkeypatch.setattr(pdl, "_capable", {0: True})
    cuda = torch.empty(1, device="meta")
    monkeypatch.setattr(type(cuda), "is_cuda", property(lambda t: True))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert pdl.enabled(cuda)
    with pdl.off():
        assert not pdl.enabled(cuda)
        with pdl.off():
            assert not pdl.enabled(cuda)
        assert not pdl.enabled(cuda)
    assert pdl.enabled(cuda)


_MOE_PTRS = {"X": "*bf16", "Wr": "*bf16", "Br": "*bf16", "Wsg": "*bf16", "Part": "*fp32",
             "Counts": "*i32", "Wout": "*fp32", "Iout": "*i64", "Gout": "*fp32",
             "Sorted": "*i32", "BlockExpert": "*i32", "Scratch": "*i32"}
ROUTE_SIG = {**_MOE_PTRS, "T": "i32", "H": "i32", "L": "i32", "NB": "i32", "stride_x": "i32",
             "stride_w": "i32"}
ROUTE_CONST = dict(E=128, E_P2=128, EW=129, TOPK=8, TOPK_P2=8, NORM=True, HAS_BIAS=False,
                   HAS_GATE=True, ALIGN=True, BM=16, BT=16, BE=16, BK=64, KSTEPS=6, KS=8,
                   CHUNK=512, TBC=32, BC=64, DOT_PREC="tf32", UPCAST=False)
GROUPED_SIG = {"X": "*bf16", "W": "*bf16", "A": "*bf16", "Sorted": "*i32",
               "BlockExpert": "*i32", "N": "i32", "K": "i32", "I": "i32", "stride_xt": "i32",
               "stride_we": "i32", "stride_wn": "i32", "stride_as": "i32", "T": "i32",
               "NBR": "i32", "WS": "*bf16", "IS": "i32", "stride_wsn": "i32"}
DOWN_SIG = {"A": "*bf16", "W": "*bf16", "Y": "*bf16", "Sorted": "*i32", "BlockExpert": "*i32",
            "N": "i32", "K": "i32", "H": "i32", "stride_as": "i32", "stride_we": "i32",
            "stride_wn": "i32", "stride_ys": "i32", "T": "i32", "NBR": "i32", "WS": "*bf16",
            "IS": "i32", "stride_wsn": "i32"}
_TILE = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, DOT_PREC="tf32", UPCAST=False)


def _moe_ptx(tmp_path, name: str, on: bool) -> list[str]:
    module, kernel, sig, const = {
        "route": ("moe_route", "_route_kernel", ROUTE_SIG, ROUTE_CONST),
        "gate_up": ("fused_moe", "_gate_up_kernel", GROUPED_SIG,
                    dict(_TILE, TOPK=8, SHARED=True)),
        "down": ("fused_moe", "_down_kernel", DOWN_SIG, dict(_TILE, SHARED=True)),
    }[name]
    return sm90_ptx(tmp_path, f"mtplab.kernels.{module}", kernel, sig, dict(const, PDL=on))


def _at(lines: list[str], pattern: str) -> list[int]:
    return [i for i, ln in enumerate(lines) if re.search(pattern, ln)]


STORE = r"\b(st|atom|red)\.global"


@pytest.mark.parametrize("name", ["route", "gate_up", "down"])
def test_the_moe_kernels_without_pdl_have_no_gdc_instruction(tmp_path, name):
    assert not any("griddepcontrol" in ln for ln in _moe_ptx(tmp_path, name, False))


def test_the_routing_triggers_at_entry_and_waits_before_it_reads_x_or_stores(tmp_path):
    lines = _moe_ptx(tmp_path, "route", True)
    trig, waits = _at(lines, r"^griddepcontrol\.launch"), _at(lines, r"^griddepcontrol\.wait")
    loads = _at(lines, r"\bld\.global")
    assert len(trig) == 1 and len(waits) == 1 and trig[0] < loads[0]
    assert loads[0] < waits[0]                       # the first router tile
    assert min(_at(lines, STORE)) > waits[0]


def test_gate_up_waits_at_entry_and_triggers_after_its_wait(tmp_path):
    """The down GEMM's reads of the routing before its own wait rely on this order."""
    lines = _moe_ptx(tmp_path, "gate_up", True)
    trig, waits = _at(lines, r"^griddepcontrol\.launch"), _at(lines, r"^griddepcontrol\.wait")
    assert len(trig) == 1 and len(waits) == 1
    assert waits[0] < trig[0] < min(_at(lines, r"\bld\.global"))


def test_down_waits_in_every_branch_before_it_reads_act_or_stores(tmp_path):
    """Three waits: a routed block's (after its block map and first weight tile), an unused
    block's, the shared expert's block's; each store comes after a wait."""
    lines = _moe_ptx(tmp_path, "down", True)
    waits = _at(lines, r"^griddepcontrol\.wait")
    assert len(waits) == 3
    assert min(_at(lines, r"\bld\.global")) < waits[0] < min(_at(lines, STORE))
    assert not _at(lines, r"^griddepcontrol\.launch")
