"""A cell's host-stage columns (workload `host_stages: true`; `mtplab bench --groups host`):
where a decode step's host time goes, per stage, and what the host issues per step.

    host_<stage>_us     host µs per decode step inside the stage's spans (instrument/
                        hostclock.py: the launch of a graph segment, the Python of
                        process_result, ...), from one generate of the measured workload
    host_step_us        the whole iteration (schedule .. the end of the step span), mean over
                        the decode steps (what throughput pays); host_step_p50_us its median
    host_loop_us        host_step_us minus the outermost stage spans: the loop's own Python
    host_replays_per_step, host_copies_per_step (`copy_`), host_ops_per_step (every other
                        aten op: fills, clones, eager kernels), host_views_per_step
                        counted over the decode steps of one more generate (OpCounter slows
                        the host, so it times nothing)
    replay_floor_us     host µs of one CUDA graph replay (one kernel), in this process
    host_floor_us       replays per step x replay_floor_us: the host time a step of that many
                        replays cannot go under
"""
from __future__ import annotations

from typing import Any

from ..instrument.hostclock import HostClock, OpCounter, replay_floor_us, replays

HOST_STAGES = ("schedule", "prepare", "resolve", "draft.seed", "draft", "tree", "verify",
               "accept", "commit", "publish", "draft_extend", "stash", "d2h", "sync",
               "process_result")


def decode_steps(eng, prompts: list, n: int, temperature: float, body) -> int:
    """Queue the prompts, run the prefill, then the decode steps inside `body()` (a context
    manager); -> the decode steps it ran."""
    for p in prompts:
        eng.add_request(p, n, ignore_eos=True, temperature=temperature)
    sched = eng.scheduler
    while sched.waiting:
        eng.step()
    d0 = sched.stats.decode_steps
    with body():
        while not eng.idle:
            eng.step()
    eng.device.synchronize()
    return sched.stats.decode_steps - d0


def host_columns(eng, prompts: list, n: int, temperature: float = 0.0) -> dict[str, Any]:
    clock = HostClock()
    with eng.spans.clocked(clock):
        eng.generate(prompts, max_new_tokens=n, ignore_eos=True, temperature=temperature)
    per = clock.per_step()
    row: dict[str, Any] = {f"host_{s.replace('.', '_')}_us": per.get(s, 0.0) for s in HOST_STAGES}
    row["host_step_us"] = per.get("step", float("nan"))
    row["host_step_p50_us"] = clock.median_per_step().get("step", float("nan"))
    row["host_loop_us"] = per.get("step", float("nan")) - per.get("stages", 0.0)
    runners = eng.worker.runners()
    oc, r0 = OpCounter(), replays(runners)
    steps = max(1, decode_steps(eng, prompts, n, temperature, lambda: oc))
    ops = dict(oc.ops)
    row["host_replays_per_step"] = (replays(runners) - r0) / steps
    row["host_copies_per_step"] = ops.pop("copy_", 0) / steps
    row["host_ops_per_step"] = sum(ops.values()) / steps
    row["host_views_per_step"] = oc.views / steps
    floor = replay_floor_us(eng.device.torch_device)
    row["replay_floor_us"] = float("nan") if floor is None else floor
    row["host_floor_us"] = row["host_replays_per_step"] * row["replay_floor_us"]
    return row
