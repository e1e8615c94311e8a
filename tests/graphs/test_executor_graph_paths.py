"""The executor's graph paths on CPU (speculative/executor.py): stage graphs and the step graph
of every worker, with a stand-in for CUDA graphs, give the eager engine's tokens.

The stand-in: a "captured" graph replays by calling its function again with captured marks
(graphs/runner.py `_call`, warm=False; no meter, so no stamps), and the future map's one
kernel runs as its plain-torch reference (kernels/move_rows.py). What it checks is the
executor's own logic: which plans get graphs, the value buffers, what the host stages, the
order of replays and eager segments, and the outputs it hands back. The CUDA side (a replay
that runs what was recorded) is tests/gpu's."""
from __future__ import annotations

import pytest

import mtplab.sched.future_map as future_map_mod
from mtplab import Engine, RunConfig
from mtplab.graphs.runner import GraphRunner
from mtplab.kernels.move_rows import move_rows_ref

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [3] * 20]


def _capture(self):
    for bs in reversed(self.buckets):
        args = {k: v[:bs] for k, v in self.static.items()}
        self._call(args, warm=True)
        self.graphs[bs] = (args, None)


def _replay(self, bs):
    args, _ = self.graphs[self.bucket(bs)]
    self.replays += 1
    return self._slice(self._call(args, warm=False), bs)


@pytest.fixture
def cpu_graphs(monkeypatch):
    monkeypatch.setattr(GraphRunner, "capture", _capture)
    monkeypatch.setattr(GraphRunner, "replay", _replay)
    monkeypatch.setattr(future_map_mod, "move_rows_triton",
                        lambda rows, moves, gather, split=0, stamp=None:
                        move_rows_ref(rows, moves, gather, split))


def _run(kw: dict, granularity, temperature: float):
    cfg = RunConfig(model="random-tiny", max_running_requests=4, cuda_graph_max_bs=4, **kw,
                    **({} if granularity is None else dict(graph_granularity=granularity)))
    if granularity is not None:
        object.__setattr__(cfg, "cuda_graphs", True)      # the config refuses it on CPU
    with pytest.MonkeyPatch.context() as mp:               # and Engine() checks it again
        mp.setattr(RunConfig, "validate", lambda self: None)
        eng = Engine(cfg)
    out = eng.generate(PROMPTS, max_new_tokens=8, ignore_eos=True, temperature=temperature,
                       seed=3)
    eng.check_invariants()
    replays = sum(r.replays for r in eng.worker.runners())
    steps = eng.stats()["decode_steps"]
    eng.close()
    return out, replays, steps


@pytest.mark.parametrize("kw", [
    dict(draft="none", overlap=True, zero_bubble=True),
    dict(draft="frozen_kv_mtp", fold_seed=False, topk=2, num_steps=3, num_draft_tokens=5,
         page_size=4, simulate_accept_len=2.5),          # accept lengths above 1

    dict(draft="eagle", overlap=True, zero_bubble=True)], ids=["target", "frozen", "eagle"])
@pytest.mark.parametrize("granularity", ["stage", "step"])
def test_graph_paths_give_the_eager_tokens(cpu_graphs, kw, granularity):
    for temperature in (0.0, 0.8):
        eager, _, _ = _run(kw, None, temperature)
        graphed, replays, steps = _run(kw, granularity, temperature)
        assert graphed == eager, (granularity, temperature)
        greedy = temperature == 0.0 or "simulate_accept_len" in kw
        if granularity == "step" and (greedy or kw["draft"] == "none"):
            assert replays == steps                    # one replay per decode step
        elif granularity == "step":
            assert replays == 0                        # sampled spec steps run eagerly
        else:
            assert replays >= 2 * steps                # resolve, verify, ... one replay each
