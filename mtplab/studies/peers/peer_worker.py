"""One engine of the peer harness (side_by_side.py) in a process of its own,
driven by the harness over two pipes, one JSON object a line (stdout and stderr go to the
group's log file):

    python -m mtplab.studies.peers.peer_worker --side mtplab|sglang|MODULE:CLASS --config JSON \\
        --rfd R --wfd W

    request                                           answer ({"ok": false, "error": "Type:
                                                      message"} when it raises)
    {"op": "start"}                                   {"ok": true, "info": {...}}
    {"op": "run", "prompts": [[ids]], "new_tokens"}   {"ok": true, "wall_s", "tokens": [per
                                                      request], "decode_steps", "accept_len"}
    {"op": "profile", "prompts", "new_tokens",        {"ok": true, "trace": path or null,
     "warmup_tokens", "dir", "steps"}                  "meter": {...}}
    {"op": "close"}                                   {"ok": true}, then the process exits

`run` submits every prompt at once and times the call from the caller's side (the engine's
own wait for its last token included). SGLang reads its environment (SGLANG_SIMULATE_ACC_LEN,
SGLANG_SIMULATE_ACC_METHOD, ...) when its modules are imported: one worker process is one
SGLang configuration, and a crash ends that worker only.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path


def _send(fd: int, msg: dict) -> None:
    data = (json.dumps(msg) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _lines(fd: int):
    buf = b""
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield json.loads(line)


class MtplabSide:
    """mtplab's Engine: the timed engine (no meter, no profiler) lives from `start` to `close`;
    `profile` builds a second engine of the same knobs with the bubble meter and the profiler,
    runs the workload, writes the run folder and frees it."""

    def __init__(self, config: dict):
        self.knobs = config["knobs"]
        self.eng = None

    def start(self) -> dict:
        import torch

        from mtplab import Engine, RunConfig
        self.eng = Engine(RunConfig(**self.knobs))
        return {"engine": "mtplab", "device": self.eng.device.name, "torch": torch.__version__}

    def run(self, prompts: list, new_tokens: int) -> dict:
        t0 = time.perf_counter()
        out = self.eng.generate(prompts, max_new_tokens=new_tokens, ignore_eos=True)
        wall = time.perf_counter() - t0            # generate ends with a device synchronize
        st = self.eng.stats()
        return {"wall_s": wall, "tokens": [len(o) for o in out],
                "decode_steps": st["decode_steps"], "accept_len": st.get("accept_len")}

    def profile(self, prompts: list, new_tokens: int, warmup_tokens: int, dir: str,
                steps: int) -> dict:
        import gc

        import torch

        from mtplab import Engine, RunConfig
        from mtplab.instrument.meter import meter_figures

        self.eng.check_invariants()
        cfg = RunConfig(**self.knobs, bubble_meter=True, profile=True, profile_wait=1,
                        profile_warmup=2, profile_active=steps, trace_dir=dir, run_name="mtplab")
        with Engine(cfg) as eng:
            prof = eng.profiler
            with prof.held():                     # the meter's run: profiler not collecting
                eng.generate(prompts, max_new_tokens=warmup_tokens, ignore_eos=True)
                eng.generate(prompts, max_new_tokens=new_tokens, ignore_eos=True)
                meter = meter_figures(eng.stats())
            while not prof.done:
                eng.generate(prompts, max_new_tokens=new_tokens, ignore_eos=True)
            eng.check_invariants()
            files = eng.finish()
        # the profiled engine's memory back to the driver: the next cell's profiled engine
        # checks the free memory beside the timed engine and SGLang (torch keeps freed blocks)
        del eng, prof
        gc.collect()
        torch.cuda.empty_cache()
        trace = files.get("trace0")
        return {"trace": str(trace) if trace else None, "meter": meter}

    def close(self) -> None:
        if self.eng is not None:
            self.eng.check_invariants()
            self.eng.close()


class SglangSide:
    """SGLang's offline engine (`sglang.Engine`, in-process: token ids in, no HTTP, no
    tokenizer), built from the server arguments of the adapter (mtplab/sglang/args.py) parsed
    by SGLang's own `prepare_server_args`."""

    TRACE_WAIT_S = 120.0

    def __init__(self, config: dict):
        self.argv = list(config["argv"])
        self.eng = None

    def start(self) -> dict:
        import sglang
        import torch
        from sglang.srt.server_args import prepare_server_args

        self.eng = sglang.Engine(server_args=prepare_server_args(self.argv))
        return {"engine": "sglang", "sglang": sglang.__version__,
                "device": torch.cuda.get_device_name(0), "torch": torch.__version__}

    def _generate(self, prompts: list, new_tokens: int) -> list:
        return self.eng.generate(input_ids=prompts, sampling_params={
            "max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True})

    def run(self, prompts: list, new_tokens: int) -> dict:
        t0 = time.perf_counter()
        outs = self._generate(prompts, new_tokens)
        wall = time.perf_counter() - t0
        metas = [o["meta_info"] for o in outs]
        tokens = [int(m["completion_tokens"]) for m in metas]
        verify = [int(m.get("spec_verify_ct") or 0) for m in metas]
        accept = None
        if any(verify):     # per verify: accepted drafts + the bonus token (as mtplab counts)
            if all("spec_num_correct_drafts" in m for m in metas):
                accept = (sum(int(m["spec_num_correct_drafts"]) for m in metas)
                          + sum(verify)) / sum(verify)
            else:           # SGLang's own spec_accept_length: completion tokens per verify
                accept = sum(tokens) / sum(verify)
        # all requests run together: a verify (spec) or a decode step (one token each) per step
        steps = max(verify) if any(verify) else max(tokens) - 1
        return {"wall_s": wall, "tokens": tokens, "decode_steps": steps, "accept_len": accept}

    def profile(self, prompts: list, new_tokens: int, warmup_tokens: int, dir: str,
                steps: int) -> dict:
        out = Path(dir)
        out.mkdir(parents=True, exist_ok=True)
        # with_stack/record_shapes off: mtplab's profiler session records neither
        self.eng.start_profile(output_dir=str(out.resolve()), num_steps=steps,
                               activities=["CPU", "GPU"], with_stack=False,
                               record_shapes=False, profile_id="sglang")
        self._generate(prompts, new_tokens)
        t_end, size = time.monotonic() + self.TRACE_WAIT_S, -1
        while time.monotonic() < t_end:       # written by the scheduler after `steps` steps:
            traces = sorted(out.rglob("*.trace.json*"))     # taken once its size holds for 1 s
            now = traces[0].stat().st_size if traces else -1
            if now > 0 and now == size:
                return {"trace": str(traces[0]), "meter": {}}
            size = now
            time.sleep(1.0)
        try:
            self.eng.stop_profile()          # the run was shorter than `steps`
        except RuntimeError:
            pass
        traces = sorted(out.rglob("*.trace.json*"))
        return {"trace": str(traces[0]) if traces else None, "meter": {}}

    def close(self) -> None:
        if self.eng is not None:
            self.eng.shutdown()


SIDES = {"mtplab": MtplabSide, "sglang": SglangSide}


def side_class(name: str):
    """mtplab | sglang | MODULE:CLASS (another side with the same methods, e.g. a test's)."""
    if name in SIDES:
        return SIDES[name]
    mod, _, cls = name.partition(":")
    return getattr(importlib.import_module(mod), cls)


def serve(side, rfd: int, wfd: int) -> int:
    for msg in _lines(rfd):
        op = msg.pop("op")
        try:
            if op == "close":
                side.close()
                _send(wfd, {"ok": True})
                return 0
            res = getattr(side, op)(**msg)
            _send(wfd, {"ok": True, **({"info": res} if op == "start" else res)})
        except BaseException as e:  # noqa: BLE001 -- every failure goes back to the harness
            traceback.print_exc()
            _send(wfd, {"ok": False, "error": f"{type(e).__name__}: {e}".strip()})
            if op == "start":
                return 1
    return 0                    # the harness closed the pipe


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", required=True)
    ap.add_argument("--config", required=True, help="JSON: the side's settings")
    ap.add_argument("--rfd", type=int, required=True)
    ap.add_argument("--wfd", type=int, required=True)
    a = ap.parse_args(argv)
    return serve(side_class(a.side)(json.loads(a.config)), a.rfd, a.wfd)


if __name__ == "__main__":
    sys.exit(main())
