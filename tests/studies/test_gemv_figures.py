"""bench_gemv's table (mtplab/studies/decode_floor/gemv_figures.py) from a results document:
each arm's median µs against the cell's floor, its noise, one table per row count; and the
entry point refuses a machine without CUDA in one sentence."""
from mtplab.studies.decode_floor import gemv_figures as gf


def test_render_puts_each_arm_beside_the_floor():
    doc = {"device": "NVIDIA H200", "sms": 132, "copy_bw": 4.0e12, "command": "bench_gemv",
           "cells": [{"shape": "o_proj", "N": 4096, "K": 4096, "M": 1, "floor_us": 8.0,
                      "config": {}, "arms": {"cublas": {"us": [10.0, 12.0, 16.0],
                                                        "max_abs_err": 0.0},
                                             "triton": {"us": [8.0, 9.0, 10.0],
                                                        "max_abs_err": 1e-3}}}]}
    md = gf.render(doc)
    assert "copy bandwidth 4.00 TB/s" in md and "## M = 1" in md
    # cuBLAS: median 12.0 µs, floor / µs 0.667, noise (16 - 10) / 12 = 50%
    assert "| o_proj | 4096 x 4096 | 8.0 | cublas | 12.0 | 0.667 | 50.0% | 0.00e+00 |" in md
    assert "| o_proj | 4096 x 4096 | 8.0 | triton | 9.0 | 0.889 | 22.2% | 1.00e-03 |" in md


def test_without_cuda_it_says_so(capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gf.main(["--out", "x"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().out
