"""mtplab.sglang: RunConfig -> SGLang server arguments (validated by SGLang's own parser where
installed), refusals, `mtplab sglang launch` (dry run, and a full run against a fake server
speaking SGLang's endpoints), and the analyser's SGLang span names."""
from __future__ import annotations

import http.server
import json
import os
import shlex
import stat
import sys
import textwrap
import threading
from pathlib import Path

import orjson
import pytest

from mtplab.analysis.bubbles import analyze, stage_of
from mtplab.config import RunConfig
from mtplab.core import ConfigError
from mtplab.sglang import client
from mtplab.sglang.args import ServerSpec, server_launch
from mtplab.sglang.cli import main_sglang
from tests.sglang_fixtures import sglang_module
from tests.analysis.test_bubbles import Synth

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 512,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32"}


@pytest.fixture
def model_dirs(tmp_path):
    t, d = tmp_path / "target", tmp_path / "draft"
    t.mkdir(), d.mkdir()
    (t / "config.json").write_text(json.dumps(LLAMA))
    (d / "config.json").write_text(json.dumps({**LLAMA, "num_hidden_layers": 1,
                                               "architectures": ["LlamaForCausalLMEagle"]}))
    return str(t), str(d)


def cfg(**kw):
    kw.setdefault("device", "cpu")
    return RunConfig(**kw)


CASES = [
    dict(draft="eagle", topk=4, num_draft_tokens=8, page_size=1, overlap=False),
    dict(draft="eagle", topk=1, page_size=16, simulate_accept_len=2.5, overlap=False),
    dict(draft="frozen_kv_mtp", topk=1, fold_seed=True, simulate_accept_len=3.0, overlap=False),
    dict(draft="none", overlap=True),
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: f"{kw['draft']}-k{kw.get('topk', 1)}")
def test_mapping_is_what_sglang_parses(model_dirs, kw):
    sa = sglang_module("sglang.srt.server_args")
    c = cfg(num_steps=3, cuda_graph_max_bs=8, seed=5, **kw)
    sl = server_launch(c, ServerSpec(model_path=model_dirs[0],
                                     draft_model_path=model_dirs[1] if c.speculative else None,
                                     device="cpu", dummy_weights=True, deterministic=True,
                                     cuda_graphs=True))
    a = sa.prepare_server_args(list(sl.argv))
    if hasattr(a, "resolve_once"):      # >= 0.5.18 validates here, 0.5.17 in __post_init__
        a.resolve_once()
    algo = {"none": None, "eagle": "EAGLE", "frozen_kv_mtp": "FROZEN_KV_MTP"}[c.draft]
    assert a.speculative_algorithm == algo
    if algo:
        assert (a.speculative_num_steps, a.speculative_eagle_topk,
                a.speculative_num_draft_tokens) == (3, c.topk, c.num_draft_tokens)
    else:   # overlap stays on for a plain decode (SGLang forces spec v2 synchronous on CPU)
        assert a.disable_overlap_schedule is False
    assert (a.page_size, a.attention_backend, a.device) == (c.page_size, "triton", "cpu")
    assert (a.cuda_graph_max_bs_decode, a.random_seed, a.max_running_requests) == (8, 5, 32)
    assert a.enable_deterministic_inference and a.load_format == "dummy"
    assert a.skip_tokenizer_init
    if c.simulate_accept_len:
        assert float(sl.env["SGLANG_SIMULATE_ACC_LEN"]) == c.simulate_accept_len


def test_flag_names_follow_the_version(model_dirs):
    c = cfg(draft="none")
    old = server_launch(c, ServerSpec(model_path="m", version="0.5.16", cuda_graphs=True)).argv
    new = server_launch(c, ServerSpec(model_path="m", version="0.5.17", cuda_graphs=True)).argv
    assert "--cuda-graph-max-bs" in old and "--cuda-graph-max-bs-decode" in new
    off_old = server_launch(c, ServerSpec(model_path="m", version="0.5.16")).argv
    off_new = server_launch(c, ServerSpec(model_path="m", version="0.5.23")).argv
    assert "--disable-cuda-graph" in off_old
    assert off_new[off_new.index("--cuda-graph-backend-decode") + 1] == "disabled"
    for flag in ("--device", "--attention-backend"):   # always explicit
        assert flag in new
    with pytest.raises(ConfigError, match="X.Y.Z"):
        server_launch(c, ServerSpec(model_path="m", version="latest"))


@pytest.mark.parametrize("kw,spec,match", [
    (dict(draft="frozen_kv_mtp", fold_seed=False), {}, "fold_seed=True"),
    (dict(draft="eagle", zero_bubble=True), {}, "zero_bubble"),
    (dict(draft="eagle", zb_draft_preexec=True), {}, "zb_draft_preexec"),
    (dict(draft="eagle", num_steps=2, simulate_accept_rates=(0.5, 0.5)), {},
     "simulate_accept_len"),
    (dict(draft="frozen_kv_mtp", fold_seed=True, topk=4), {"attention_backend": "flashmla"},
     "triton"),
    (dict(draft="frozen_kv_mtp", fold_seed=True, topk=4, page_size=16),
     {"attention_backend": "trtllm_mha"}, "page_size>1"),
    (dict(draft="eagle"), {"draft_model_path": None}, "draft model directory"),
])
def test_knobs_sglang_lacks_are_refused(kw, spec, match):
    s = {"model_path": "m", "draft_model_path": "d", **spec}
    with pytest.raises(ConfigError, match=match) as e:
        server_launch(cfg(**kw), ServerSpec(**s))
    assert str(e.value).count(". ") == 0 and str(e.value).endswith(".")   # one sentence


def test_dry_run_prints_env_and_one_shell_line(capsys, model_dirs, tmp_path):
    spaced = tmp_path / "t x"
    os.rename(model_dirs[0], spaced)
    rc = main_sglang(["launch", "--dry-run", "--model", str(spaced), "--draft", "eagle",
                      "--draft-model", model_dirs[1], "--topk", "2", "--num-draft-tokens", "5",
                      "--overlap", "false", "--simulate-accept-len", "2.5", "--python", "python3",
                      "--extra-args", "--mem-fraction-static 0.6"])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:2] == ["export SGLANG_SIMULATE_ACC_LEN=2.5",
                         "export SGLANG_SIMULATE_ACC_METHOD=match-expected"]
    words = shlex.split(lines[2])
    assert words[:2] == ["SGLANG_SIMULATE_ACC_LEN=2.5", "SGLANG_SIMULATE_ACC_METHOD=match-expected"]
    cmd = words[2:]
    assert cmd[:3] == ["python3", "-m", "sglang.launch_server"]
    assert cmd[cmd.index("--model-path") + 1] == str(spaced)
    assert "--disable-overlap-schedule" in cmd and "--skip-tokenizer-init" in cmd
    assert cmd[cmd.index("--speculative-num-draft-tokens") + 1] == "5"
    assert cmd[cmd.index("--cuda-graph-max-bs-decode") + 1] == "32"
    assert cmd[-2:] == ["--mem-fraction-static", "0.6"]


def test_dry_run_refusal_is_one_line(capsys):
    rc = main_sglang(["launch", "--dry-run", "--model", "m", "--draft", "frozen_kv_mtp",
                      "--draft-model", "d", "--fold-seed", "false"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mtplab sglang launch: error:") and "\n" not in err
    assert "set --fold-seed true" in err                   # the flag, not fold_seed=True


# ------------------------------------------------------------------ a fake SGLang server
FAKE_SERVER = textwrap.dedent('''
    import http.server, json, os, shutil, sys
    argv = sys.argv[1:]
    if argv[:2] == ["-m", "sglang.launch_server"]:
        argv = argv[2:]
    port = int(argv[argv.index("--port") + 1])
    TRACE = os.environ.get("FAKE_TRACE")
    if os.environ.get("FAKE_STARTS"):
        with open(os.environ["FAKE_STARTS"], "a") as f:
            f.write(" ".join(argv) + "\\n")

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def _json(self):
            n = int(self.headers.get("Content-Length", 0))
            return json.loads(self.rfile.read(n) or b"{}")
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def do_POST(self):
            body = self._json()
            if self.path == "/generate":
                if os.environ.get("FAKE_DIE_AT_GENERATE"):     # the server dies mid-run
                    os._exit(9)
                n = body["sampling_params"]["max_new_tokens"]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                done, ver = 0, 0
                while done < n:
                    step = min(3, n - done)      # 2 accepted drafts + bonus per verify
                    done, ver = done + step, ver + 1
                    meta = {"completion_tokens": done, "spec_verify_ct": ver}
                    chunk = {"output_ids": list(range(done)), "meta_info": meta}
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n")
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\\n\\n")
            elif self.path == "/start_profile":
                out = body["output_dir"]
                shutil.copy(TRACE, os.path.join(out, body["profile_id"] + "-TP-0.trace.json.gz"))
                self.send_response(200)
                self.end_headers()
            elif self.path == "/stop_profile":
                self.send_response(200)
                self.end_headers()
            else:
                self.send_response(404)
                self.end_headers()

    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def sglang_steps_trace(path: Path) -> Path:
    """Two verify steps in SGLang 0.5.17 names, one 0.5.23 DRAFT step, kernels inside."""
    s = Synth()
    x = 0.0
    for name in ("step[TARGET_VERIFY bs=2]", "step[DRAFT bs=2]", "step[TARGET_VERIFY bs=2]"):
        s.host(name, x, 100.0)
        c = s.launch(x + 5)
        s.gpu(c, x + 10, 60.0)
        x += 120.0
    return s.write(path, gz=True)


def free_port() -> int:
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def test_launch_drives_a_fake_server_end_to_end(tmp_path, monkeypatch, capsys, model_dirs):
    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE_SERVER)
    py = tmp_path / "fakepython"
    py.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                  f"{shlex.quote(str(script))} \"$@\"\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_TRACE", str(sglang_steps_trace(tmp_path / "t.trace.json.gz")))
    rc = main_sglang(["launch", "--model", model_dirs[0], "--draft", "eagle",
                      "--draft-model", model_dirs[1], "--port", str(free_port()),
                      "--prompts", "4", "--prompt-len", "8",
                      "--max-new-tokens", "7", "--concurrency", "2", "--profile", "true",
                      "--profile-active", "5",
                      "--trace-dir", str(tmp_path / "traces"), "--run-name", "r1",
                      "--python", str(py)])
    assert rc == 0
    m = orjson.loads((tmp_path / "traces" / "r1" / "metrics.json").read_bytes())
    assert m["requests"] == 4 and m["completion_tokens"] == 28
    assert m["accept_len"] == pytest.approx(7 / 3)       # 3 + 3 + 1 tokens in 3 verifies
    assert m["tok_per_s"] > 0 and m["tpot_ms"] >= 0 and m["itl_p50_ms"] >= 0
    assert m["trace"].endswith("r1-TP-0.trace.json.gz")
    steps = (tmp_path / "traces" / "r1" / "analysis")
    assert any(steps.iterdir())
    assert 0 < m["bubble_frac"] < 1


def fake_python(tmp_path) -> Path:
    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE_SERVER)
    py = tmp_path / "fakepython"
    py.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                  f"{shlex.quote(str(script))} \"$@\"\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return py


@pytest.mark.slow
def test_sweep_cells_with_backend_sglang_share_a_server(tmp_path, monkeypatch, model_dirs):
    """Two arms with equal server arguments (they differ only in the workload) share one
    server, the third starts another; the guard ends the last one after sglang_idle_s."""
    from mtplab.sweep.grid import grid_from_dict
    from mtplab.sweep.runner import run_sweep
    starts = tmp_path / "starts.txt"
    monkeypatch.setenv("FAKE_STARTS", str(starts))
    base = {"backend": "sglang", "sglang_model_path": model_dirs[0],
            "sglang_draft_model_path": model_dirs[1],
            "sglang_python": str(fake_python(tmp_path)), "sglang_port": free_port(),
            "sglang_idle_s": 15, "draft": "eagle", "device": "cpu", "prompt_len_tokens": 8,
            "warmup_output_len_tokens": 0, "batch_size": 2}
    grid = grid_from_dict({"base": base, "arms": [{"output_len_tokens": 4},
                                                  {"output_len_tokens": 7},
                                                  {"output_len_tokens": 4, "num_steps": 2}]})
    cells = grid.cells()
    bad = grid_from_dict({"base": {**base, "sglang_modle_path": "x"}}).cells()[0]
    assert "sglang_modle_path" in bad.dropped
    df = run_sweep(cells, tmp_path / "sweep", progress=False)
    assert list(df["status"]) == ["ok"] * 3, df["error"].tolist()
    assert list(df["sglang.server_started"]) == [True, False, True]
    assert list(df["sglang.completion_tokens"]) == [8, 14, 8]
    assert len(starts.read_text().splitlines()) == 2
    state = json.loads((tmp_path / "sweep" / "cells" / "sglang" / "server.json").read_text())
    for _ in range(300):                                   # the guard stops it when idle
        try:
            os.kill(state["pid"], 0)
        except OSError:
            break
        import time
        time.sleep(0.1)
    else:
        os.killpg(state["pid"], 15)
        pytest.fail("the server outlived its idle time")


def test_launch_reports_a_server_that_dies(tmp_path, capsys, model_dirs):
    py = tmp_path / "deadpython"
    py.write_text("#!/bin/sh\nexit 3\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    rc = main_sglang(["launch", "--model", model_dirs[0], "--port", str(free_port()),
                      "--python", str(py), "--trace-dir", str(tmp_path)])
    assert rc == 2
    assert "exited before" in capsys.readouterr().err


# ------------------------------------------------------------------ analyser span names
@pytest.mark.parametrize("name,stage", [
    ("step[DRAFT bs=4]", "draft"), ("step[VERIFY bs=4]", "verify"),
    ("step[EXTEND bs=2 toks=128]", "prefill"), ("step[DECODE bs=8]", "verify"),
    ("step[DRAFT_LOOP raw_bs=3 bs=4 topk=2]", "draft"), ("draft", "draft"),
    ("draft_extend", "draft_extend"), ("step[TARGET_VERIFY bs=4]", "verify"),
    ("step[DRAFT_EXTEND_V2 bs=4]", "draft_extend"), ("step[MIXED bs=4]", "prefill"),
    ("step[IDLE bs=0]", None), ("scheduler.recv_requests", None),
])
def test_sglang_span_names_map_to_stages(name, stage):
    assert stage_of(name) == stage


def test_analyser_reads_sglang_step_spans(tmp_path):
    """SGLang's forward spans become decode iterations: a draft and the verify after it are
    one step; a verify whose draft fell before the profiler window is one alone; a trace with
    no draft-then-verify pair keeps one step per forward."""
    res = analyze(sglang_steps_trace(tmp_path / "s.trace.json.gz"))
    assert list(res.steps["name"]) == ["step[decode bs=2: TARGET_VERIFY]",
                                       "step[decode bs=2: DRAFT+TARGET_VERIFY]"]
    assert res.summary["step_source"].startswith("SGLang forward spans grouped into decode")
    assert res.steps["host_dur_us"].tolist() == [100.0, 220.0]
    s = Synth()
    for k, name in enumerate(("step[EXTEND bs=2]", "step[DRAFT_LOOP raw_bs=2 bs=2 topk=1]",
                              "step[TARGET_VERIFY bs=2]", "step[DRAFT_EXTEND_V2 bs=2]",
                              "step[DRAFT_LOOP raw_bs=2 bs=2 topk=1]",
                              "step[TARGET_VERIFY bs=2]")):
        s.host(name, 100.0 * k, 80.0)
        s.gpu(s.launch(100.0 * k + 5), 100.0 * k + 10, 60.0)
    res = analyze(s.write(tmp_path / "v2.json"))
    assert list(res.steps["name"]) == [
        "step[EXTEND bs=2]",
        "step[decode bs=2: DRAFT_LOOP+TARGET_VERIFY+DRAFT_EXTEND_V2]",
        "step[decode bs=2: DRAFT_LOOP+TARGET_VERIFY]"]
    s = Synth()                     # 0.5.17 EAGLE: the draft runs in a graph, no span
    for k, name in enumerate(["step[TARGET_VERIFY bs=2]", "step[DRAFT_EXTEND_V2 bs=2]"] * 2):
        s.host(name, 100.0 * k, 80.0)
        s.gpu(s.launch(100.0 * k + 5), 100.0 * k + 10, 60.0)
    res = analyze(s.write(tmp_path / "v17.json"))
    assert list(res.steps["name"]) == ["step[decode bs=2: TARGET_VERIFY+DRAFT_EXTEND_V2]"] * 2
    s = Synth()
    for k in range(3):
        s.host("step[DECODE bs=2]", 100.0 * k, 80.0)
        s.gpu(s.launch(100.0 * k + 5), 100.0 * k + 10, 60.0)
    res = analyze(s.write(tmp_path / "target.json"))
    assert list(res.steps["name"]) == ["step[DECODE bs=2]"] * 3
    assert res.summary["step_source"] == "step spans"


def test_gemma4_config_only_dirs_load_as_target_and_assistant(tmp_path):
    """The Frozen-KV model directories load back through transformers' AutoConfig with the
    architectures SGLang keys on (Gemma4AssistantForCausalLM -> FROZEN_KV_MTP)."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers import AutoConfig

    from mtplab.sglang.models import write_gemma4_frozen_dirs
    t, a = write_gemma4_frozen_dirs(tmp_path, hidden_size=128, assistant_hidden_size=64)
    tc, ac = AutoConfig.from_pretrained(t), AutoConfig.from_pretrained(a)
    assert tc.architectures == ["Gemma4ForCausalLM"] and tc.hidden_size == 128
    assert ac.architectures == ["Gemma4AssistantForCausalLM"]
    assert ac.backbone_hidden_size == 128 and ac.get_text_config().hidden_size == 64
    assert sorted(p.name for p in t.iterdir()) == ["config.json"]


def test_llama_eagle_config_only_dirs(tmp_path, capsys):
    """`mtplab sglang models`: a preset-shaped Llama target and an SGLang EAGLE draft at its
    width, config only (transformers reads both back)."""
    assert main_sglang(["models", "--out", str(tmp_path), "--model", "random-medium"]) == 0
    assert "draft" in capsys.readouterr().out
    t = json.loads((tmp_path / "target" / "config.json").read_text())
    d = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert t["architectures"] == ["LlamaForCausalLM"] and t["torch_dtype"] == "bfloat16"
    assert d["architectures"] == ["LlamaForCausalLMEagle"] and d["num_hidden_layers"] == 1
    assert {k: v for k, v in d.items() if k not in ("architectures", "num_hidden_layers")} == \
        {k: v for k, v in t.items() if k not in ("architectures", "num_hidden_layers")}
    assert sorted(p.name for p in (tmp_path / "target").iterdir()) == ["config.json"]
    assert main_sglang(["models", "--out", str(tmp_path), "--model", "no-such"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    c = transformers.AutoConfig.from_pretrained(tmp_path / "target")
    assert (c.hidden_size, c.num_key_value_heads, c.vocab_size) == (1024, 4, 32000)


def test_models_and_run_take_both_depth_spellings(tmp_path, capsys):
    """`--model X@N` and `--model X --layers N` name one model in `sglang models` and in
    `mtplab run` alike; two different depths are one error."""
    for argv in (["--model", "llama3-8b-like@2"], ["--model", "llama3-8b-like", "--layers", "2"]):
        out = tmp_path / "_".join(argv).replace("@", "-")
        assert main_sglang(["models", "--out", str(out), *argv]) == 0, capsys.readouterr().err
        t = json.loads((out / "target" / "config.json").read_text())
        assert t["num_hidden_layers"] == 2
    assert RunConfig(model="llama3-8b-like@2", device="cpu").model == "llama3-8b-like@2"
    assert RunConfig(model="llama3-8b-like", layers=2, device="cpu").model == "llama3-8b-like@2"
    assert RunConfig(model="llama3-8b-like@2", layers=2, device="cpu").model == "llama3-8b-like@2"
    with pytest.raises(ConfigError, match="names 6 layers and layers=2"):
        RunConfig(model="llama3-8b-like@6", layers=2, device="cpu")
    capsys.readouterr()
    assert main_sglang(["models", "--out", str(tmp_path / "x"), "--model", "llama3-8b-like@6",
                        "--layers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "names 6 layers" in err


# ------------------------------------------------------------------ only the server it started
@pytest.fixture
def stub_server():
    """Something else answering SGLang's endpoints on a port: /health 200, /generate a token."""
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def do_POST(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'data: {"meta_info": {"completion_tokens": 1}}\n\ndata: [DONE]\n\n')

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_launch_refuses_a_port_another_server_answers_on(tmp_path, capsys, model_dirs,
                                                         stub_server):
    """A stub on the port and a server that cannot even start (no sglang): refused before the
    start, nothing measured, no run folder (not the stub's tok/s with rc 0)."""
    py = tmp_path / "nosglang"
    py.write_text("#!/bin/sh\necho \"No module named 'sglang'\" >&2\nexit 1\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    rc = main_sglang(["launch", "--model", model_dirs[0], "--port", str(stub_server),
                      "--python", str(py), "--trace-dir", str(tmp_path / "traces")])
    err = capsys.readouterr().err
    assert rc == 2 and f"port {stub_server} on 127.0.0.1 is already in use" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "traces").exists()


def test_launch_fails_when_its_server_dies_during_the_run(tmp_path, monkeypatch, capsys,
                                                          model_dirs):
    monkeypatch.setenv("FAKE_DIE_AT_GENERATE", "1")
    rc = main_sglang(["launch", "--model", model_dirs[0], "--port", str(free_port()),
                      "--python", str(fake_python(tmp_path)),
                      "--trace-dir", str(tmp_path / "traces"), "--run-name", "r"])
    err = capsys.readouterr().err
    assert rc == 2 and "the server process exited (code 9) during the run" in err, err
    assert not (tmp_path / "traces" / "r" / "metrics.json").exists()


def test_health_from_another_process_is_not_taken(stub_server):
    """A 200 from /health counts only while the started process lives: had it died, the
    answer came from someone else."""
    with pytest.raises(client.ServerError, match="is another process"):
        client.wait_healthy(f"http://127.0.0.1:{stub_server}",
                            alive=iter([True, False]).__next__)


def test_sweep_server_refuses_a_busy_port(tmp_path, model_dirs, stub_server):
    from mtplab.sglang.sweep import ensure_server
    spec = ServerSpec(model_path=model_dirs[0], port=stub_server)
    sl = server_launch(cfg(), spec)
    with pytest.raises(client.ServerError, match="already in use"):
        ensure_server(sl, spec, tmp_path / "sglang", sys.executable, 5.0)
    assert not (tmp_path / "sglang" / "server.json").exists()      # nothing was started


@pytest.mark.parametrize("settings,message", [
    ({"sglang_model_path": "/nonexistent"}, "model_path /nonexistent is not a directory"),
    ({"sglang_extra_args": "--foo 'x"}, "is not a shell-quoted string"),
    ({"sglang_device": "tpu"}, "SGLang has no device 'tpu'"),
    ({"draft": "frozen_kv_mtp", "fold_seed": True}, "is not a Frozen-KV assistant"),
])
def test_sweep_cells_sglang_cannot_run_are_dropped_up_front(model_dirs, settings, message):
    """A `backend: sglang` cell with a missing model directory (or anything else the server
    would refuse) is dropped before it runs, never reported ok."""
    from mtplab.sweep.grid import make_cell
    base = {"backend": "sglang", "sglang_model_path": model_dirs[0],
            "sglang_draft_model_path": model_dirs[1], "draft": "eagle", "device": "cpu"}
    assert make_cell(base).dropped is None
    assert message in (make_cell({**base, **settings}).dropped or "")


def _frozen_dirs(tmp_path):
    from mtplab.sglang.models import write_gemma4_frozen_dirs
    pytest.importorskip("transformers", reason="transformers is not installed")
    return write_gemma4_frozen_dirs(tmp_path / "g4", hidden_size=128, assistant_hidden_size=64)


LAUNCH_REFUSALS = [   # (argv after launch; {t}/{d} = target/draft dirs, {file} a file; message)
    (["--extra-args", "--foo 'x"], "--extra-args: \"--foo 'x\" is not a shell-quoted list"),
    (["--python", "/nonexistent"], "--python /nonexistent is not an executable"),
    (["--python", "{file}"], "--python {file} is not an executable"),
    (["--extra-args", "--host 0.0.0.0"], "--extra-args sets --host, which the adapter sets"),
    (["--extra-args=--port=31000"], "--extra-args sets --port, which the adapter sets"),
    (["--extra-args", "--mem-fraction-static 0.5 --model-path /x"],
     "--extra-args sets --model-path, which the adapter sets"),
    (["--extra-args", "--page-size 64"], "--extra-args sets --page-size, which the adapter"),
    (["--extra-args", "--speculative-algorithm EAGLE"], "--extra-args sets --speculative-algo"),
    (["--draft", "eagle", "--draft-model", "{d}", "--draft-vocab", "hot:64", "--token-map",
      "{file}.missing"], "--token-map {file}.missing is not a file"),
    (["--vocab", "5"], "--vocab: must be above 10"),
    (["--prompt-len", "-3"], "--prompt-len: must be a positive integer"),
    (["--trace-dir", "{file}"], "is a file, not a folder"),
    (["--run-name", "../../escape"], "--run-name ../../escape must be a plain folder name"),
    (["--port", "-1"], "--port: '-1' is not a TCP port"),
    (["--port", "0"], "--port: '0' is not a TCP port"),
    (["--port", "99999"], "--port: '99999' is not a TCP port"),
    (["--device", "tpu"], "--device: invalid choice: 'tpu'"),
    (["--fused", "true"], "SGLang has no equivalent of --fused"),
    (["--fold-seed", "true"], "--fold-seed folds the draft's seed forward"),
    (["--attention-backend", "bogus"], "--attention-backend: invalid choice: 'bogus'"),
    (["--draft-model", "{d}"], "--draft-model is given but --draft none runs no draft"),
    (["--model", "/nonexistent"], "--model /nonexistent is not a directory"),
    (["--model", "{file}"], "is not a directory"),
    (["--draft", "eagle"], "--draft eagle needs a draft model directory; pass --draft-model."),
    (["--draft", "frozen_kv_mtp", "--draft-model", "{d}"],
     "--draft-model {d} is not a Frozen-KV assistant"),
]


@pytest.mark.parametrize("argv,message", LAUNCH_REFUSALS, ids=[" ".join(a[:2])
                                                               for a, _ in LAUNCH_REFUSALS])
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_launch_refusals_are_one_line_and_make_nothing(tmp_path, capsys, model_dirs, argv,
                                                       message, dry):
    afile = tmp_path / "afile"
    afile.write_text("x")
    fill = dict(t=model_dirs[0], d=model_dirs[1], file=str(afile))
    argv = [a.format(**fill) for a in argv]
    base = ["launch", "--model", model_dirs[0], "--port", str(free_port()),
            "--trace-dir", str(tmp_path / "traces"), "--python", sys.executable]
    before = sorted(tmp_path.iterdir())
    assert main_sglang(base + argv + (["--dry-run"] if dry else [])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(**fill) in err, err
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_a_port_something_listens_on_is_refused(model_dirs, capsys, dry):
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        so.listen()
        port = so.getsockname()[1]
        argv = ["launch", "--model", model_dirs[0], "--port", str(port)]
        assert main_sglang(argv + (["--dry-run"] if dry else [])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"port {port} on 127.0.0.1 is already in use" in err, err


def test_frozen_and_eagle_drafts_are_checked_against_their_directory(tmp_path, capsys):
    t, assistant = _frozen_dirs(tmp_path)
    ok = ["launch", "--dry-run", "--model", str(t), "--draft-model", str(assistant)]
    assert main_sglang(ok + ["--draft", "frozen_kv_mtp"]) == 0
    assert "FROZEN_KV_MTP" in capsys.readouterr().out
    assert main_sglang(ok + ["--draft", "eagle"]) == 2          # SGLang would run it as frozen
    assert "is a Frozen-KV assistant" in capsys.readouterr().err


@pytest.mark.parametrize("layers", ["0", "-1"])
def test_models_refuses_draft_layers_below_one(tmp_path, capsys, layers):
    assert main_sglang(["models", "--out", str(tmp_path / "m"), "--draft-layers", layers]) == 2
    assert "--draft-layers: must be a positive integer" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


# ------------------------------------------------------------------ one dialect with `mtplab run`
def _help(argv, capsys, monkeypatch) -> str:
    from mtplab import cli
    monkeypatch.setenv("COLUMNS", "400")                 # argparse wraps at hyphens too
    try:
        assert cli.main([*argv, "--help"]) == 0
    except SystemExit as e:           # `run` exits through argparse, `sglang` returns
        assert e.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_launch_takes_every_run_flag_with_its_help(capsys, monkeypatch):
    """Every RunConfig field is a flag of both commands, with the same value syntax and the
    field's own help text (knob metadata); each launch-only flag has a help line too."""
    from dataclasses import fields
    run_help = _help(["run"], capsys, monkeypatch)
    launch_help = _help(["sglang", "launch"], capsys, monkeypatch)
    for f in fields(RunConfig):
        flag, doc = "--" + f.name.replace("_", "-"), " ".join(f.metadata["help"].split())
        for text in (run_help, launch_help):
            assert f"{flag} " in text and doc in text, (f.name, text[:200])
    for flag in ("--overlap {true,false}", "--fold-seed {true,false}", "--model TEXT",
                 "--simulate-accept-rates X,Y,...", "--dummy-weights {true,false}"):
        assert flag in launch_help
    from mtplab.sglang.cli import build_parser
    launch = next(a for a in build_parser()._subparsers._group_actions[0].choices.values()
                  if a.prog.endswith("launch"))
    for action in launch._actions:
        assert action.help, action.option_strings


@pytest.mark.parametrize("argv,present,absent", [
    (["--overlap", "true"], [], ["--disable-overlap-schedule"]),
    (["--overlap", "false"], ["--disable-overlap-schedule"], []),
    ([], ["--disable-overlap-schedule", "--cuda-graph-max-bs-decode"], []),   # RunConfig's defaults
    (["--cuda-graphs", "false"], ["--cuda-graph-backend-decode"], ["--cuda-graph-max-bs-decode"]),
    (["--device", "cpu"], ["--device cpu", "--cuda-graph-backend-decode"], []),
    (["--dtype", "bfloat16", "--context-len", "4096", "--max-total-tokens", "8192"],
     ["--dtype bfloat16", "--context-length 4096", "--max-total-tokens 8192"], []),
    (["--dtype", "auto"], [], ["--dtype"]),
    (["--page-size", "16", "--max-running-requests", "8", "--seed", "3"],
     ["--page-size 16", "--max-running-requests 8", "--random-seed 3"], []),
    (["--attention-backend", "fa3"], ["--attention-backend fa3"], []),
    (["--dummy-weights", "true"], ["--load-format dummy"], []),
])
def test_launch_flags_reach_the_server(model_dirs, capsys, argv, present, absent):
    assert main_sglang(["launch", "--dry-run", "--model", model_dirs[0], *argv]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    for p in present:
        assert p in line, (p, line)
    for a in absent:
        assert a not in line, (a, line)


def test_server_knobs_are_what_sglang_parses(model_dirs):
    sa = sglang_module("sglang.srt.server_args")
    sl = server_launch(cfg(), ServerSpec(model_path=model_dirs[0], device="cpu", dtype="bfloat16",
                                         context_len=256, max_total_tokens=4096))
    a = sa.prepare_server_args(list(sl.argv))
    assert (a.dtype, a.context_length, a.max_total_tokens) == ("bfloat16", 256, 4096)


@pytest.mark.parametrize("message,flags", [
    ("page_size=3 is not a power of two; use 1, 2, 4.",
     "--page-size 3 is not a power of two; use 1, 2, 4."),
    ("set fold_seed=True to compare like with like.",
     "set --fold-seed true to compare like with like."),
    ("draft='eagle' needs a draft model directory; pass draft_model_path.",
     "--draft eagle needs a draft model directory; pass --draft-model."),
    ("with topk=1 the draft is a chain of num_steps+1 tokens, so num_draft_tokens must be 4.",
     "with --topk 1 the draft is a chain of num_steps+1 tokens, so --num-draft-tokens must be 4."),
    ("model_path /m is not a directory", "--model /m is not a directory"),
    ("a draft model, a sglang_draft_model_path", "a draft model, a sglang_draft_model_path"),
    ("/runs/trace_dir/m: no config.json", "/runs/trace_dir/m: no config.json"),     # a path
])
def test_errors_name_the_flag(message, flags):
    from mtplab.flags import as_flags
    from mtplab.sglang.cli import launch_flags
    assert as_flags(message, launch_flags()) == flags


def test_models_writes_a_frozen_assistant_that_launch_takes(tmp_path, capsys):
    """`sglang models --draft frozen_kv_mtp`: a Gemma-4 target mirroring a Gemma-pattern
    preset (its default) and the Frozen-KV assistant mirroring mtplab's, which `launch --draft
    frozen_kv_mtp` accepts (and `--draft eagle` not); a preset SGLang cannot run that way, or
    a depth for the assistant, is one error."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from mtplab.models.zoo import assistant_config, model_config
    assert main_sglang(["models", "--out", str(tmp_path), "--draft", "frozen_kv_mtp"]) == 0
    assert "assistant" in capsys.readouterr().out
    t = json.loads((tmp_path / "target" / "config.json").read_text())
    a = json.loads((tmp_path / "assistant" / "config.json").read_text())
    c = model_config("gemma4-31b-like@6")
    assert t["architectures"] == ["Gemma4ForCausalLM"] and t["hidden_size"] == c.hidden_size
    assert t["layer_types"] == c.layer_types and t["sliding_window"] == c.sliding_window
    assert a["architectures"] == ["Gemma4AssistantForCausalLM"]
    assert a["backbone_hidden_size"] == c.hidden_size
    assert a["text_config"]["layer_types"] == [c.layer_types[i]
                                               for i in assistant_config(c).kv_layers]
    ok = ["launch", "--dry-run", "--model", str(tmp_path / "target"), "--draft-model",
          str(tmp_path / "assistant")]
    assert main_sglang([*ok, "--draft", "frozen_kv_mtp"]) == 0
    assert "--speculative-algorithm FROZEN_KV_MTP" in capsys.readouterr().out
    assert main_sglang([*ok, "--draft", "eagle"]) == 2
    capsys.readouterr()
    assert main_sglang(["models", "--out", str(tmp_path / "g"), "--draft",
                        "gemma4_assistant"]) == 0           # mtplab's Gemma-4 assistant
    g = json.loads((tmp_path / "g" / "assistant" / "config.json").read_text())["text_config"]
    assert g["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
    assert g["hidden_size"] == c.hidden_size // 2
    capsys.readouterr()
    for extra, message in ((["--model", "random-tiny"], "it has no sliding-window layer"),
                           (["--draft-layers", "2"], "leave --draft-layers out")):
        assert main_sglang(["models", "--out", str(tmp_path / "x"), "--draft", "frozen_kv_mtp",
                            *extra]) == 2
        assert message in capsys.readouterr().err
