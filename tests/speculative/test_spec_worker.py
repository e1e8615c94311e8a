"""Spec worker details: frozen KV untouched by drafting, constant draft positions, sampling,
simulated acceptance, stats, and the known-bad fixtures (each seed bug re-introduced on
purpose must fail loudly)."""
import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.mem import sizing
from mtplab.mem.allocator import AllocatorError
from mtplab.mem.invariants import InvariantError
from mtplab.mem.kv_manager import RowOverflowError
from mtplab.sched import scheduler as sched_mod
from tests.helpers import make_agreeable, random_prompts

PROMPTS = random_prompts(4, [3, 20, 50, 9], 320, seed=2)


def test_frozen_draft_leaves_target_kv_bit_identical_at_constant_positions():
    eng = Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", topk=2, num_steps=3,
                           num_draft_tokens=5, page_size=4))
    eng.generate(PROMPTS[:1], max_new_tokens=4, ignore_eos=True)   # warm
    # Prefill the prompts so the future map holds seeds, then draft once by hand.
    reqs = [eng.add_request(p, 8, ignore_eos=True) for p in PROMPTS]
    eng.step()                                                       # prefill
    positions = []
    orig = eng.draft_model.forward

    def spy(tokens, hidden, pos, *a, **k):
        positions.append(pos.clone())
        return orig(tokens, hidden, pos, *a, **k)

    eng.draft_model.forward = spy
    k0, v0 = eng.kv_cache.k.clone(), eng.kv_cache.v.clone()
    rows = torch.tensor([r.kv.row for r in reqs])
    seq = torch.tensor([r.kv.kv_committed_len for r in reqs])
    w = eng.worker
    inp = w.future_map.gather(rows)
    dw, max_kv = w.draft_worker, int(seq.max()) + 8
    steps = dw.steps(dw.seed(inp, rows, seq, max_kv), rows, seq, max_kv)
    assert len(steps) == 3
    assert torch.equal(eng.kv_cache.k, k0) and torch.equal(eng.kv_cache.v, v0)
    assert len(positions) == 3                       # seed + S-1 steps
    for p in positions:
        assert torch.equal(p, (seq - 1).repeat_interleave(p.numel() // len(seq)))


@pytest.mark.parametrize("draft", ["frozen_kv_mtp", "eagle"])
def test_sampling_spec_runs_and_is_reproducible(draft):
    cfg = RunConfig(model="random-tiny", draft=draft, topk=2, num_steps=2, num_draft_tokens=4,
                    page_size=4)
    a = Engine(cfg).generate(PROMPTS, max_new_tokens=12, temperature=0.8, top_p=0.9, seed=1,
                             ignore_eos=True)
    eng = Engine(cfg)
    b = eng.generate(PROMPTS, max_new_tokens=12, temperature=0.8, top_p=0.9, seed=1,
                     ignore_eos=True)
    assert a == b and all(len(o) == 12 for o in a)
    eng.check_invariants()


@pytest.mark.parametrize("mean", [1.0, 2.5, 4.0])
def test_simulated_acceptance_hits_its_mean(mean):
    eng = Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", num_steps=3,
                           simulate_accept_len=mean, page_size=16))
    eng.generate(random_prompts(8, [5, 30], 320), max_new_tokens=120, ignore_eos=True)
    st = eng.stats()
    assert st["simulated"] is True
    assert abs(st["accept_len"] - mean) < 0.15, st["accept_len"]
    assert eng.cfg.manifest()["config"]["simulate_accept_len"] == mean
    eng.check_invariants()


def test_stats_report_acceptance():
    eng = Engine(RunConfig(model="random-tiny", draft="eagle", num_steps=3))
    make_agreeable(eng)
    eng.generate(PROMPTS, max_new_tokens=20, ignore_eos=True)
    st = eng.stats()
    assert st["accept_len"] >= 2.0 and st["simulated"] is False
    rates = st["accept_rate_per_pos"]
    assert len(rates) == 3 and all(1 >= x >= y >= 0 for x, y in zip(rates, rates[1:]))
    assert abs(st["accept_len"] - (1 + sum(rates))) < 1e-9
    assert sum(st["accept_len_hist"].values()) == len(eng.scheduler.stats.accept_lens)
    assert st["verify_steps"] == st["decode_steps"]


# -- known-bad fixtures: re-introduce each seed bug, the checks must catch it --------------

def _run(cfg, max_new=24):
    eng = Engine(cfg)
    make_agreeable(eng)
    eng.generate(PROMPTS, max_new_tokens=max_new, ignore_eos=True)
    eng.check_invariants()


@pytest.mark.breaks_engine
def test_bug_commit_twice_is_caught(monkeypatch):
    orig = sched_mod.append_decode

    def twice(batch, toks, lens, host, committed, stats, *health):
        done = orig(batch, toks, lens, host, committed, stats, *health)
        for r, n in zip(batch.reqs, lens.tolist()):
            if not r.finished:
                r.kv.kv_committed_len += n           # seed 001: committed advanced twice
        return done
    monkeypatch.setattr(sched_mod, "append_decode", twice)
    cfg = RunConfig(model="random-tiny", draft="frozen_kv_mtp", debug_invariants=True)
    with pytest.raises((InvariantError, RowOverflowError)):
        _run(cfg)


@pytest.mark.breaks_engine
def test_bug_freeing_rejected_slots_is_caught(monkeypatch):
    orig = sched_mod.Scheduler.process_result

    def free_tail(self, p):
        orig(self, p)
        if p.kind != "decode":
            return
        for r in self.running:                       # seed 000: free the rejected tail now
            P = r.kv.page_size
            keep = -(-r.kv.kv_committed_len // P)
            if len(r.kv.pages) > keep:
                self.kv.allocator.free_pages_list(r.kv.pages[keep:])   # ... but keep owning it
    monkeypatch.setattr(sched_mod.Scheduler, "process_result", free_tail)
    cfg = RunConfig(model="random-tiny", draft="eagle", page_size=4, debug_invariants=True)
    with pytest.raises((InvariantError, AllocatorError)):
        _run(cfg)


@pytest.mark.breaks_engine
def test_bug_row_one_page_too_narrow_is_caught(monkeypatch):
    real = sizing.row_width
    monkeypatch.setattr(sizing, "row_width",
                        lambda c, a, d, p: real(c, a, d, p) - 2 * p)   # seed 003
    cfg = RunConfig(model="random-tiny", draft="eagle", topk=4, num_steps=3,
                    num_draft_tokens=8, page_size=16, context_len=128)
    eng = Engine(cfg)
    with pytest.raises(RowOverflowError, match="rows are"):
        # a request running up to context_len needs the full width
        eng.generate([[5] * 60], max_new_tokens=128 - 60, ignore_eos=True)


@pytest.mark.parametrize("fold", [False, True])
def test_the_seed_and_its_top_k_run_inside_the_draft_seed_span(monkeypatch, fold):
    """The seed's top-k is seed work: it runs inside `draft.seed` (unfolded: its own segment;
    folded: nested in `draft`), so neither its host time nor its kernels fall outside a
    stage (the meter would count them as bubble, the what-if predictor as the loop's)."""
    from mtplab.instrument.spans import Spans
    from mtplab.speculative import draft_frozen
    open_stages: list = []
    real_stage = Spans.stage

    class Tracked:
        def __init__(self, cm, name):
            self.cm, self.name = cm, name

        def __enter__(self):
            open_stages.append(self.name)
            return self.cm.__enter__()

        def __exit__(self, *exc):
            open_stages.pop()
            return self.cm.__exit__(*exc)

    monkeypatch.setattr(Spans, "stage", lambda self, name, *a, **k:
                        Tracked(real_stage(self, name, *a, **k), name))
    seeds: list = []
    real_seed = draft_frozen.FrozenDraftWorker.seed

    def seed(self, *a, **k):
        seeds.append(tuple(open_stages))
        return real_seed(self, *a, **k)
    monkeypatch.setattr(draft_frozen.FrozenDraftWorker, "seed", seed)
    topks: list = []
    real_topk = draft_frozen.branch_topk
    monkeypatch.setattr(draft_frozen, "branch_topk",
                        lambda *a, **k: topks.append(tuple(open_stages)) or real_topk(*a, **k))
    eng = Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", fold_seed=fold,
                           page_size=4))
    eng.generate(PROMPTS, max_new_tokens=8, ignore_eos=True)
    eng.check_invariants()
    assert seeds and topks
    want = ("draft", "draft.seed") if fold else ("draft.seed",)
    assert all(s == want for s in seeds), set(seeds)
    assert set(topks) <= {want, ("draft",)}, set(topks)   # the seed's, the steps' (in draft)


def test_every_worker_is_what_the_scheduler_drives():
    """TargetWorker, SpecWorker and a spec_schedule's ScheduleWorker all have the seam
    core.Worker names (prefill, decode, runners, close), each one executor's plans."""
    from mtplab.core import Worker
    from mtplab.speculative.arms import ScheduleWorker
    from mtplab.speculative.target_worker import TargetWorker
    from mtplab.speculative.worker import SpecWorker
    for cfg in (dict(draft="none"), dict(draft="frozen_kv_mtp", topk=2),
                dict(draft="frozen_kv_mtp", topk=2, spec_schedule="2:2x2,4:off")):
        eng = Engine(RunConfig(model="random-tiny", max_running_requests=4, **cfg))
        assert isinstance(eng.worker, Worker)
        assert isinstance(eng.worker, (TargetWorker, SpecWorker, ScheduleWorker))
        assert eng.scheduler.worker is eng.worker
        eng.close()

