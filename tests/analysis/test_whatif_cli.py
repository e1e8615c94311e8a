"""`mtplab whatif` at the door: a corrupt run folder and a what-if that is not well-formed
get one sentence on stderr and exit code 2, nothing on stdout (analysis/run_folder.py, the
one loader; analysis/whatif.py parse_whatif). Synthetic run folders: no engine."""
from __future__ import annotations

import json

import pytest

from mtplab.analysis.whatif_cli import main_whatif
from tests.analysis.test_whatif import tables

CFG = {"device": "cuda", "overlap": True, "zb_async_d2h": True, "zb_device_seq_lens": False,
       "zb_draft_preexec": False, "fold_seed": False, "cuda_graphs": True,
       "draft": "frozen_kv_mtp", "num_steps": 3}
ANCHOR = {"meter_tok_per_s": 500.0, "latency_us": 4.0, "seed_forward": True,
          "eager_launches": ["draft.seed"]}


def write_run(d, cfg=CFG, anchor=ANCHOR):
    st, host = tables()
    d.mkdir(parents=True, exist_ok=True)
    st.to_parquet(d / "meter_stages.parquet")
    host.to_parquet(d / "host_steps.parquet")
    (d / "manifest.json").write_text(json.dumps({"config": cfg}))
    (d / "whatif.json").write_text(json.dumps(anchor))
    return d


def refused(argv, capsys) -> str:
    assert main_whatif(argv) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1 and out.err.startswith("mtplab whatif: error: ")
    assert "Traceback" not in out.err
    return out.err


def test_a_good_folder_answers(tmp_path, capsys):
    d = write_run(tmp_path / "r")
    assert main_whatif([str(d), "--what", "zero_bubble=on"]) == 0
    assert "| zero_bubble=on |" in capsys.readouterr().out


def _swap(d):
    (d / "host_steps.parquet").write_bytes((d / "meter_stages.parquet").read_bytes())


def _truncate(name):
    def f(d):
        b = (d / name).read_bytes()
        (d / name).write_bytes(b[:len(b) // 2])
    return f


def _put(name, data: bytes):
    return lambda d: (d / name).write_bytes(data)


def _drop(name, column):
    def f(d):
        import pandas as pd
        pd.read_parquet(d / name).drop(columns=column).to_parquet(d / name)
    return f


def _cfg(**kw):
    return lambda d: (d / "manifest.json").write_text(json.dumps({"config": {**CFG, **kw}}))


def _anchor(**kw):
    return lambda d: (d / "whatif.json").write_text(json.dumps({**ANCHOR, **kw}))


CORRUPT = {
    **{f"{name} {how}": f for name in ("manifest.json", "whatif.json", "host_steps.parquet",
                                       "meter_stages.parquet")
       for how, f in (("empty", _put(name, b"")), ("truncated", _truncate(name)),
                      ("garbage", _put(name, b"\x00\xff\x13garbage\x89PNG")))},
    **{f"{name} holds {what}": _put(name, text) for name in ("manifest.json", "whatif.json")
       for what, text in (("a list", b"[1, 2]"), ("null", b"null"), ("a string", b'"x"'))},
    "manifest config is a list": lambda d: (d / "manifest.json").write_text('{"config": []}'),
    "swapped tables": _swap,
    "host table without period_us": _drop("host_steps.parquet", "period_us"),
    "meter table without lane": _drop("meter_stages.parquet", "lane"),
    "draft nonsense": _cfg(draft="bogus"),
    "overlap nonsense": _cfg(overlap="maybe"),
    "num_steps negative": _cfg(num_steps=-1),
    "latency a string": _anchor(latency_us="fast"),
    "latency NaN": lambda d: (d / "whatif.json").write_text(
        '{"meter_tok_per_s": 1.0, "latency_us": NaN}'),
    "eager_launches a number": _anchor(eager_launches=5),
}


@pytest.mark.parametrize("how", list(CORRUPT))
def test_a_corrupt_run_folder_is_one_sentence(tmp_path, capsys, how):
    d = write_run(tmp_path / "r")
    CORRUPT[how](d)
    err = refused([str(d)], capsys)
    assert "record the run again" in err or "lacks" in err


@pytest.mark.parametrize("what", [
    "speed=on", "overlap=maybe", "overlap=ON", "ｏｖｅｒｌａｐ=on", "overlap=ｏｎ",
    "gpu:verify*-1", "gpu:verify+-5", "gpu:verify*nan", "gpu:verify+1e300", "host:loop=1e400",
    "host:loop*inf", "zero_bubble=on,zb_async_d2h=off", "overlap=on,overlap=off",
    "host:nothing=0", "gpu:nothing*2", "gpu:verify*２",
])
def test_a_what_if_that_is_not_well_formed_is_refused(tmp_path, capsys, what):
    d = write_run(tmp_path / "r")
    refused([str(d), "--what", "overlap=off", "--what", what], capsys)
