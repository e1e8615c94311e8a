"""scripts/sglang_h100.sh: the staging of SGLang onto the GPU machine (pack here; receive,
install there) on a tiny fake payload, the launch lines of its arms (dry run, and SGLang's own
parser where installed), and the import probe's bookkeeping. No network, no GPU."""
from __future__ import annotations

import hashlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.sglang_fixtures import sglang_module

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "sglang_h100.sh"
PROBE = REPO / "scripts" / "sglang_probe.py"
pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("bash", "split", "sha256sum", "setsid")),
    reason="needs bash, split, sha256sum and setsid")


def script_env(env=None) -> dict:
    """The script's environment: ours, this Python as $PYTHON, then `env`."""
    return {**os.environ, "PYTHON": sys.executable, **(env or {})}


def sh(*args, env=None, check=True):
    r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                       env=script_env(env), timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"{args} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def fake_payload(path: Path) -> bytes:
    """A site tree (one package + its dist-info) as tar.xz, partly incompressible."""
    files = {"fake_pkg/__init__.py": b"VALUE = 42\n", "fake_pkg/blob.bin": os.urandom(5000),
             "fake_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: fake-pkg\n"}
    with tarfile.open(path, "w:xz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return files["fake_pkg/blob.bin"]


def test_pack_receive_install_roundtrip(tmp_path):
    work, carry, dev = tmp_path / "work", tmp_path / "carry", tmp_path / "dev"
    work.mkdir(), carry.mkdir()
    payload = work / "sglang-site.tar.xz"
    blob = fake_payload(payload)
    env = {"MTP_SGL_WORK": str(work), "MTP_SGL_CARRY_ROOT": str(carry),
           "MTP_SGL_PART_BYTES": "2000", "MTP_SGL_TMP": str(dev), "OUT": str(tmp_path / "out")}
    sh("pack", str(payload), env=env)
    folders = sorted(carry.glob(".sgl_c*"), key=lambda p: int(p.name[6:]))
    n = -(-payload.stat().st_size // 2000)
    assert [p.name for p in folders] == [f".sgl_c{i}" for i in range(1, n + 1)] and n >= 3
    manifest = (folders[0] / "MANIFEST.sha256").read_text()
    assert hashlib.sha256(payload.read_bytes()).hexdigest() in manifest
    for f in folders:      # one part and the same manifest in each call's folder
        assert len(list(f.glob("*.part-*"))) == 1
        assert (f / "MANIFEST.sha256").read_text() == manifest

    sh("receive", str(folders[0]), env=env)
    r = sh("install", env=env, check=False)            # parts of later calls still missing
    assert r.returncode == 3 and f"missing {n - 1} part(s)" in r.stdout
    for f in folders[1:]:
        sh("receive", str(f), env=env)
    r = sh("install", env=env)
    site = dev / "site"
    assert (site / "fake_pkg" / "__init__.py").read_text() == "VALUE = 42\n"
    assert (site / "fake_pkg" / "blob.bin").read_bytes() == blob
    assert (site / ".payload_sha256").is_file() and not (dev / "stage" / payload.name).exists()
    assert "already holds" in sh("install", env=env).stdout       # idempotent on a warm machine
    assert "== install" in (tmp_path / "out" / "sgl.log").read_text()

    part = next((dev / "stage").glob("*.part-001"))             # a corrupt part is refused
    data = bytearray(part.read_bytes())
    data[10] ^= 0xFF
    part.write_bytes(bytes(data))
    (site / ".payload_sha256").unlink()
    r = sh("install", env=env, check=False)
    assert r.returncode == 4 and "corrupt" in r.stdout
    assert sh("receive", str(tmp_path / "nope"), env=env, check=False).returncode == 2


def test_overlay_unpacks_verified_extras_over_the_site(tmp_path):
    """`overlay .sgl_cx`: its sha256-checked tarballs land in the installed site (flashinfer's
    JIT sources, the deep_gemm stub); before install, or with a corrupt tarball, it refuses."""
    dev, extra = tmp_path / "dev", tmp_path / ".sgl_cx"
    extra.mkdir()
    env = {"MTP_SGL_TMP": str(dev), "OUT": str(tmp_path / "out")}
    fake_payload(extra / "extra.tar.xz")
    (extra / "MANIFEST.sha256").write_text(
        f"{hashlib.sha256((extra / 'extra.tar.xz').read_bytes()).hexdigest()}  ./extra.tar.xz\n")
    r = sh("overlay", str(extra), env=env, check=False)
    assert r.returncode == 2 and "install first" in r.stdout
    (dev / "site").mkdir(parents=True)
    (dev / "site" / ".payload_sha256").write_text("x\n")
    sh("overlay", str(extra), env=env)
    assert (dev / "site" / "fake_pkg" / "__init__.py").read_text() == "VALUE = 42\n"
    data = bytearray((extra / "extra.tar.xz").read_bytes())
    data[20] ^= 0xFF
    (extra / "extra.tar.xz").write_bytes(bytes(data))
    r = sh("overlay", str(extra), env=env, check=False)
    assert r.returncode == 4 and "corrupt" in r.stdout


def arm_lines(tmp_path) -> dict:
    out = sh("dry", env={"MTP_SGL_TMP": str(tmp_path)}).stdout.splitlines()
    arms, cur = {}, None
    for ln in out:
        if ln.startswith("# "):
            cur = ln[2:]
            arms[cur] = {"env": {}, "argv": None}
        elif ln.startswith("export "):
            k, v = ln[7:].split("=", 1)
            arms[cur]["env"][k] = v
        else:
            arms[cur]["argv"] = shlex.split(ln)
    return arms


@pytest.mark.slow
def test_dry_run_of_the_arms(tmp_path):
    arms = arm_lines(tmp_path)
    assert sorted(arms) == ["off", "on", "warm"]
    for name, a in arms.items():
        argv = a["argv"]
        i = argv.index("sglang.launch_server")
        flags = argv[i + 1:]
        assert a["env"] == {"SGLANG_SIMULATE_ACC_LEN": "2.5",
                            "SGLANG_SIMULATE_ACC_METHOD": "match-expected"}
        opt = {k: v for k, v in zip(flags, flags[1:]) if k.startswith("--")}
        assert opt["--speculative-algorithm"] == "EAGLE"
        assert (opt["--speculative-num-steps"], opt["--speculative-eagle-topk"],
                opt["--speculative-num-draft-tokens"]) == ("3", "1", "4")
        assert opt["--attention-backend"] == "triton" and opt["--device"] == "cuda"
        assert opt["--sampling-backend"] == "pytorch" and opt["--grammar-backend"] == "none"
        assert opt["--cuda-graph-max-bs-decode"] == "8" and opt["--max-running-requests"] == "8"
        assert opt["--load-format"] == opt["--speculative-draft-load-format"] == "dummy"
        assert opt["--model-path"] == str(tmp_path / "models" / "target")
        assert ("--disable-overlap-schedule" in flags) == (name == "off")
    assert len({a["argv"][a["argv"].index("--port") + 1] for a in arms.values()}) == 3


def test_arms_are_what_sglang_parses(tmp_path):
    """The exact server arguments of `pair`'s arms through SGLang's own parser (device cpu
    here: 0.5.17's checks for cuda ask the GPU for its memory)."""
    sa = sglang_module("sglang.srt.server_args")
    subprocess.run([sys.executable, "-m", "mtplab.cli", "sglang", "models", "--out",
                    str(tmp_path / "models")], check=True, capture_output=True, cwd=REPO)
    for _name, a in arm_lines(tmp_path).items():
        flags = a["argv"][a["argv"].index("sglang.launch_server") + 1:]
        flags[flags.index("--device") + 1] = "cpu"
        s = sa.prepare_server_args(flags)
        assert s.speculative_algorithm == "EAGLE" and s.speculative_num_draft_tokens == 4
        assert (s.sampling_backend, s.grammar_backend, s.attention_backend) == \
            ("pytorch", "none", "triton")
        assert s.load_format == "dummy" and s.skip_tokenizer_init
        assert s.mem_fraction_static == 0.6 and s.max_running_requests == 8


def test_probe_reports_every_missing_module_at_once(tmp_path):
    """Two unguarded imports of absent modules and one guarded: the probe names both
    required ones (and where), the guarded one as optional, and a missing symbol (reported as
    the submodule `from pkg import name` falls back to), all in one pass."""
    pkg = tmp_path / "probe_demo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import absent_one\nfrom absent_two.sub import thing\n"
                                     "try:\n    import absent_three\nexcept ImportError:\n"
                                     "    absent_three = None\n")
    (pkg / "bad.py").write_text("from probe_demo import no_such_symbol\n")
    more = tmp_path / "more.txt"
    more.write_text("probe_demo\nprobe_demo.bad\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}",
           "MTP_PROBE_MORE": str(more), "MTP_PROBE_ONLY_MORE": "1"}
    r = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, env=env,
                       timeout=120)
    out = r.stdout
    assert r.returncode == 1 and "probe: FAILED" in out
    req = out.split("REQUIRED missing", 1)[1].split("\n", 1)[0]
    assert "absent_one" in req and "absent_two" in req and "absent_three" not in req
    assert "probe_demo/__init__.py:1" in out and "probe_demo/__init__.py:2" in out
    opt = out.split("optional missing", 1)[1].split("\n", 1)[0]
    assert "absent_three" in opt and out.index("optional missing") < out.index("REQUIRED")
    assert "probe_demo.no_such_symbol  <- " in out and "probe_demo/bad.py:1" in out


def device_env(tmp_path, server_python, port) -> dict:
    """`pair` / `warm` here: an installed-site marker, the probe on one stdlib module, and a
    fake SGLang as the server's python."""
    site = tmp_path / "dev" / "site"
    site.mkdir(parents=True)
    (site / ".payload_sha256").write_text("x\n")
    more = tmp_path / "probe.txt"
    more.write_text("json\n")
    return {"MTP_SGL_TMP": str(tmp_path / "dev"), "OUT": str(tmp_path / "out"),
            "MTP_SGL_SERVER_PYTHON": str(server_python), "MTP_SGL_PORT": str(port),
            "MTP_PROBE_MORE": str(more), "MTP_PROBE_ONLY_MORE": "1"}


@pytest.mark.slow
def test_pair_runs_both_arms_against_a_fake_server(tmp_path, monkeypatch):
    from tests.sglang_ref.test_sglang_adapter import fake_python, free_port, sglang_steps_trace
    monkeypatch.setenv("FAKE_TRACE", str(sglang_steps_trace(tmp_path / "t.trace.json.gz")))
    env = device_env(tmp_path, fake_python(tmp_path), free_port())
    r = sh("pair", env=env, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["arm_off.log", "arm_on.log", "results.tgz",
                                                    "sgl.log", "summary.json"]
    s = __import__("json").loads((out / "summary.json").read_text())
    for arm in ("on", "off"):
        m = s[f"overlap_{arm}"]
        assert m["requests"] == 32 and m["completion_tokens"] == 32 * 128
        assert "--disable-overlap-schedule" in m["server_command"] or arm == "on"
        assert 0 < m["bubble_frac"] < 1
    assert s["tok_per_s_on_over_off"] > 0
    with tarfile.open(out / "results.tgz") as t:
        names = t.getnames()
    assert "traces/sglang_h100_on/metrics.json" in names
    assert any(n.startswith("traces/sglang_h100_off/analysis/") for n in names)
    assert "probe: OK" in (out / "sgl.log").read_text()
    cfg = (tmp_path / "dev" / "models" / "draft" / "config.json").read_text()
    assert "LlamaForCausalLMEagle" in cfg


def hanging_server(tmp_path) -> tuple[Path, Path]:
    """A fake server python that records its pid and a child's, then hangs -> (it, pids)."""
    pids = tmp_path / "pids"
    hang = tmp_path / "hangpython"
    hang.write_text(f"#!/bin/sh\necho $$ >> {shlex.quote(str(pids))}\n"
                    "sleep 300 & echo $! >> " + shlex.quote(str(pids)) + "\nwait\n")
    hang.chmod(0o755)
    return hang, pids


def assert_all_gone(pids: Path) -> None:
    for pid in pids.read_text().split():
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", pid


@pytest.mark.slow
def test_warm_stops_a_server_that_never_answers(tmp_path):
    """A server that hangs is stopped at the deadline, with its whole process group."""
    hang, pids = hanging_server(tmp_path)
    # the deadline counts from warm's start: prepare (model dirs, probe) and the launcher's
    # imports take 10-25 s on a busy 2-core machine; 60 s leaves the fake server time to hang
    env = {**device_env(tmp_path, hang, 1), "MTP_SGL_DEADLINE": "60"}
    r = sh("warm", env=env, check=False)
    assert r.returncode != 0
    assert "TIMEOUT after" in r.stdout and "tail of" in r.stdout
    assert pids.is_file(), "the fake server never started: " + r.stdout
    assert_all_gone(pids)


@pytest.mark.slow
def test_a_terminated_warm_stops_its_server(tmp_path):
    """TERM to the script (the device call's timeout) stops the running arm's process group
    before the script exits: no server is left behind."""
    hang, pids = hanging_server(tmp_path)
    env = script_env(device_env(tmp_path, hang, 1))
    p = subprocess.Popen(["bash", str(SCRIPT), "warm"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(600):                 # the server and its child are up
            if pids.is_file() and len(pids.read_text().split()) == 2:
                break
            assert p.poll() is None, p.communicate()[0]
            time.sleep(0.1)
        else:
            raise AssertionError("the fake server did not start within 60 s")
        p.terminate()
        out = p.communicate(timeout=60)[0]
    finally:
        p.kill()
    assert p.returncode == 143 and "stopped by a signal" in out, out
    assert_all_gone(pids)


def test_warm_launches_nothing_when_the_deadline_is_spent(tmp_path):
    """A deadline used up before the launch says so, and starts no server."""
    started = tmp_path / "started"
    server = tmp_path / "serverpython"
    server.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(started))}\n")
    server.chmod(0o755)
    env = {**device_env(tmp_path, server, 1), "MTP_SGL_DEADLINE": "0"}
    r = sh("warm", env=env, check=False)
    assert r.returncode == 124, r.stdout + r.stderr
    assert "TIMEOUT before launch" in r.stdout and "raise it" in r.stdout
    assert not started.exists() and not (tmp_path / "out" / "arm_warm.log").exists()


@pytest.mark.slow
def test_peer_resumes_a_carried_result_and_packs_what_comes_back(tmp_path):
    """`peer FLAGS`: prepare (the probe once per site), the harness with its own flags (a dry
    run here: no engine), a carried results.json resumed (MTP_PEER_FROM), and at most the
    four peer_* files next to sgl.log under $OUT, named as the device returns them."""
    pytest.importorskip("transformers", reason="the harness writes Gemma-4 directories")
    env = device_env(tmp_path, sys.executable, 1)
    carried = tmp_path / ".sgl_cresults"
    carried.mkdir()
    import dataclasses
    from mtplab.studies.peers.peer_plan import Workload
    (carried / "results.json").write_text(__import__("json").dumps(
        {"workload": dataclasses.asdict(Workload()), "cells": {}}))
    env["MTP_PEER_FROM"] = str(carried)
    r = sh("peer", "--dry-run", "--shapes", "random-medium", "--drafts", "eagle", "--bs", "1",
           env=env, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["peer_results.json", "sgl.log"]
    log = (out / "sgl.log").read_text()
    assert "probe: OK" in log and f"peer: resuming {carried}/results.json" in log
    assert "# random-medium_eagle_overlap-on (bs [1])" in log and "--deadline-s" not in log
    r = sh("peer", "--dry-run", "--shapes", "random-medium", "--drafts", "eagle", "--bs", "1",
           env=env, check=False)
    assert r.returncode == 0 and "the probe passed on this site already" in r.stdout


@pytest.mark.slow
def test_peer_packs_large_traces_in_parts_that_join(tmp_path):
    """Traces over one file's limit come back as parts that `cat` joins into the archive; an
    earlier `peer` of the same call leaves no stale part behind."""
    pytest.importorskip("transformers", reason="the harness writes Gemma-4 directories")
    env = {**device_env(tmp_path, sys.executable, 1), "MTP_SGL_OUT_BYTES": "4000"}
    traces = tmp_path / "dev" / "peer" / "traces" / "cell" / "sglang"
    traces.mkdir(parents=True)
    blob = os.urandom(9000)                     # incompressible: 3 parts of 4000 bytes
    (traces / "x.trace.json.gz").write_bytes(blob)
    out = tmp_path / "out"
    out.mkdir()
    (out / "peer_traces.tgz.part-3").write_text("stale")
    flags = ("peer", "--dry-run", "--shapes", "random-medium", "--drafts", "eagle", "--bs", "1")
    r = sh(*flags, env=env, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    parts = sorted(out.glob("peer_traces.tgz.part-*"))
    assert [p.name for p in parts] == [f"peer_traces.tgz.part-{i}" for i in range(3)]
    assert all(p.stat().st_size <= 4000 for p in parts) and not (out / "peer_traces.tgz").exists()
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as t:
        assert t.extractfile("traces/cell/sglang/x.trace.json.gz").read() == blob
    (traces / "y.trace.json.gz").write_bytes(os.urandom(9000))     # over 3 parts: no raw traces
    r = sh(*flags, env=env, check=False)
    assert r.returncode == 0 and "leaving the raw traces out" in r.stdout
    assert not list(out.glob("peer_traces.tgz.part-*"))
    with tarfile.open(out / "peer_traces.tgz") as t:
        assert not [n for n in t.getnames() if n.endswith(".trace.json.gz")]


def test_moe_runs_the_floor_runner_with_the_site_on_the_path(tmp_path):
    """`moe FLAGS`: bench_moe_floor with its flags, the staged site first on PYTHONPATH and the
    report folder under $OUT; here (no CUDA) the runner's own refusal and exit code come
    back through sgl.log. Without an installed site it says what to run first."""
    env = device_env(tmp_path, sys.executable, 1)
    r = sh("moe", "--only", "library", env=env, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    log = (tmp_path / "out" / "sgl.log").read_text()
    assert "== moe --only library" in log
    assert "bench_moe_floor needs CUDA." in log and "moe: exit 2" in log
    (tmp_path / "dev" / "site" / ".payload_sha256").unlink()
    r = sh("moe", env=env, check=False)
    assert r.returncode == 2 and "is empty: run receive + install first" in r.stdout
