"""The batch-aware speculation schedule (RunConfig.spec_schedule): the knob's forms and
refusals, and greedy output == target-only across bucket switches for every draft kind, with
the running batch crossing buckets both ways (requests finishing, waiting ones admitted),
overlap and zero_bubble on and off, KV invariants after every iteration."""
import dataclasses
import json

import pytest

from mtplab import Engine, RunConfig
from mtplab import spec_schedule as ss
from mtplab.config import ConfigError
from tests.helpers import assert_live_identity, make_agreeable, random_prompts

# Two waves through 4 rows: the first 4 requests finish one by one (staggered lengths: the
# batch shrinks 4 -> 1), then 3 more arrive and are admitted (it grows back) and finish.
PROMPTS = random_prompts(7, [3, 9, 17, 5, 30, 2, 12], 320, seed=5)
MAX_NEW = [40, 6, 24, 14, 30, 12, 20]
WAVE = 4
BASE = dict(model="random-tiny", max_running_requests=4, context_len=96)
# every bucket a different arm, off between two speculative ones
SCHED = "1:2x1,2:off,3:3x2,4:1x1"


def two_waves(eng, after_step=lambda: None) -> list:
    """Run PROMPTS through `eng` in the two waves above (the second admitted when one request
    of the first is left), `after_step()` after every engine step; -> the requests."""
    reqs = [eng.add_request(p, m, ignore_eos=True)
            for p, m in zip(PROMPTS[:WAVE], MAX_NEW[:WAVE])]
    while not eng.idle or len(reqs) < len(PROMPTS):
        if len(reqs) < len(PROMPTS) and sum(not r.finished for r in reqs) <= 1:
            reqs += [eng.add_request(p, m, ignore_eos=True)
                     for p, m in zip(PROMPTS[WAVE:], MAX_NEW[WAVE:])]
        eng.step()
        after_step()
    return reqs


def run(cfg: RunConfig, agreeable: bool = True, stats: bool = False):
    """-> (outputs, the arm of each decode step[, the scheduler's stats])."""
    eng = Engine(cfg)
    if agreeable:
        make_agreeable(eng)
    arms = []
    if cfg.spec_schedule is not None:
        pick = eng.worker.arm
        eng.worker.arm = lambda bs: arms.append(pick(bs)) or arms[-1]

    def live_identity():
        if eng.scheduler.in_flight is None:        # overlap: lengths ahead of the outputs
            assert_live_identity(eng)
    reqs = two_waves(eng, live_identity)
    eng.check_invariants()
    assert eng.allocator.free_pages == eng.allocator.total_pages
    out = [r.output_ids for r in reqs], arms
    return out + (eng.scheduler.stats,) if stats else out


_REF = {}


def reference(agreeable: bool = True):
    if agreeable not in _REF:
        _REF[agreeable] = run(RunConfig(**BASE), agreeable)[0]
    return _REF[agreeable]


def switches(arms) -> set:
    return {(a, b) for a, b in zip(arms, arms[1:]) if a != b}


@pytest.mark.parametrize("draft", ["frozen_kv_mtp", "eagle", "gemma4_assistant"])
@pytest.mark.parametrize("loop", ["normal", "overlap_zb"])
def test_lossless_across_bucket_switches(draft, loop):
    """Every arm runs, the schedule switches into and out of off and between two speculative
    settings in both directions, and the tokens are target-only's (overlap on or off)."""
    cfg = RunConfig(**BASE, draft=draft, num_steps=3, topk=2, spec_schedule=SCHED,
                    overlap=loop != "normal", zero_bubble=loop != "normal",
                    debug_invariants=True)
    out, arms = run(cfg)
    assert out == reference()
    assert set(arms) == {(2, 1), (0, 1), (3, 2), (1, 1)}
    sw = switches(arms)
    bucket = {s: i for i, (_, _, s) in enumerate(ss.ranges(cfg.spec_schedule))}
    assert any(bucket[a] > bucket[b] for a, b in sw)        # the batch shrinking
    assert any(bucket[a] < bucket[b] for a, b in sw)        # and growing
    assert any(a == (0, 1) for a, _ in sw) and any(b == (0, 1) for _, b in sw)


@pytest.mark.parametrize("draft", ["frozen_kv_mtp", "eagle"])
def test_predrafts_stay_consistent_across_switches(draft):
    """zb_draft_preexec drafts a round early and proposes what the draft would have proposed
    then: every step's accept length equals the run without it. An arm in two buckets with
    off between them must not take its candidates from before the off steps as pre-drafted
    (the arm forgets its pre-drafts on every switch)."""
    runs = [run(RunConfig(**BASE, draft=draft, num_steps=3, topk=2, overlap=True,
                          spec_schedule="1:3x2,2:off,3:3x2,4:1x1", zero_bubble=zb,
                          zb_draft_preexec=zb), stats=True) for zb in (True, False)]
    (out_on, arms, on), (out_off, _, off) = runs
    assert out_on == out_off == reference()
    assert on.predrafted_steps > 0 and on.accept_lens == off.accept_lens
    assert arms.index((0, 1)) < len(arms) - 1 - arms[::-1].index((3, 2))


@pytest.mark.parametrize("draft", ["frozen_kv_mtp", "eagle"])
def test_lossless_with_random_drafts_and_pages(draft):
    """Drafts that accept almost nothing, page size 16 and fold_seed where it applies."""
    cfg = RunConfig(**BASE, draft=draft, num_steps=3, topk=4, page_size=16,
                    fold_seed=draft == "frozen_kv_mtp", overlap=True,
                    spec_schedule="1:3x4,2:off,4:2x2", debug_invariants=True)
    out, arms = run(cfg, agreeable=False)
    assert out == reference(False)
    assert len(set(arms)) == 3


def test_sampled_steps_and_consume_once_across_switches():
    """temperature > 0 (target-only tree sampling) through every arm, with the future map's
    consume-once check: each arm reads only what the previous step published and stashed."""
    eng = Engine(RunConfig(**BASE, draft="eagle", num_steps=2, topk=2, overlap=True,
                           spec_schedule="2:2x2,4:off", debug_future_map=True,
                           debug_invariants=True))
    reqs = [eng.add_request(p, m, temperature=0.8, seed=i)
            for i, (p, m) in enumerate(zip(PROMPTS, MAX_NEW))]
    while not eng.idle:
        eng.step()
    eng.check_invariants()
    assert [len(r.output_ids) for r in reqs] == MAX_NEW
    assert all(eng.worker.steps.values())


def test_simulated_acceptance_per_bucket():
    """A simulated mean accept length becomes one per-position rate: a bucket of S steps
    accepts at most S+1 tokens per verify, an off bucket exactly 1."""
    eng = Engine(RunConfig(**BASE, draft="frozen_kv_mtp", num_steps=3,
                           simulate_accept_len=3.0, spec_schedule="2:3x1,4:off"))
    arms = {}
    decode = eng.worker.decode

    def spy(x):
        out = decode(x)
        arms.setdefault(eng.worker.arm(x.rows.shape[0]), []).append(out.accept_lens.clone())
        return out
    eng.worker.decode = spy
    for p, m in zip(PROMPTS[:WAVE], MAX_NEW[:WAVE]):
        eng.add_request(p, m, ignore_eos=True)
    while not eng.idle:
        eng.step()
    eng.check_invariants()
    import torch
    on, off = torch.cat(arms[(3, 1)]), torch.cat(arms[(0, 1)])
    assert int(off.max()) == 1 and int(on.max()) <= 4 and float(on.float().mean()) > 1.5


def test_geometric_rate():
    assert ss.geometric_rate(1.0, 3) == pytest.approx(0.0, abs=1e-9)
    assert ss.geometric_rate(1.5, 1) == pytest.approx(0.5)
    assert ss.geometric_rate(1.75, 2) == pytest.approx(0.5)
    assert ss.geometric_rate(4.0, 3) == 1.0


def test_forms_normalise_and_round_trip(tmp_path):
    want = {2: (3, 1), 4: "off", 8: (2, 4)}
    f = tmp_path / "s.yaml"
    f.write_text(ss.to_yaml(want, {"model": "random-tiny", "device": "cpu"}))
    for form in ("2:3x1,4:off,8:2x4", {2: [3, 1], "4": False, 8: (2, 4)},
                 "{2: [3, 1], 4: off, 8: [2, 4]}", str(f)):
        cfg = RunConfig(draft="eagle", num_steps=3, topk=4, max_running_requests=8,
                        spec_schedule=form)
        assert cfg.spec_schedule == want, form
    back = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert RunConfig(**back).spec_schedule == want
    assert ss.text(want) == "2:3x1,4:off,8:2x4"
    assert ss.ranges(want) == [(0, 2, (3, 1)), (2, 4, (0, 1)), (4, 8, (2, 4))]


REFUSALS = [
    (dict(draft="none", spec_schedule="8:off"), "needs a draft"),
    (dict(spec_schedule="4:3x1,2:off,8:off"), r"bucket 2 comes after bucket 4 \(unsorted\)"),
    (dict(spec_schedule="4:3x1,4:2x1,8:off"), r"bucket 4 is given twice"),
    (dict(spec_schedule="4:5x1,8:off"), r"num_steps=5.*set num_steps=5 and topk=1"),
    (dict(spec_schedule="4:2x4,8:off"), r"topk=4.*set num_steps=3 and topk=4"),
    (dict(spec_schedule="4:3x1,16:off"), r"bucket 16 lies above max_running_requests=8"),
    (dict(spec_schedule="4:3x1"), r"ends at bucket 4.*end it with a bucket 8"),
    (dict(spec_schedule="4:3x1,8:off", topk=2, num_draft_tokens=5), "leave it unset"),
    (dict(spec_schedule="4:3,8:off"), "not two whole numbers|not \\(num_steps, topk\\)"),
    (dict(spec_schedule="4:0x1,8:off"), "use off for no speculation"),
    (dict(spec_schedule="four:off"), "is not a batch size"),
    (dict(spec_schedule={4: "of", 8: "off"}), r"bucket 4 has 'of'"),
    (dict(spec_schedule="missing.yaml"), "no file 'missing.yaml'"),
    (dict(spec_schedule=7), "wrong type"),
]


@pytest.mark.parametrize("kw,match", REFUSALS)
def test_refusals_name_the_problem_and_the_fix(kw, match):
    args = dict(draft="eagle", num_steps=3, topk=1, max_running_requests=8)
    args.update(kw)
    with pytest.raises(ConfigError, match=match) as e:
        RunConfig(**args)
    assert "\n" not in str(e.value)


def test_bench_group_smoke_emits_a_schedule_the_knob_loads(tmp_path):
    """mtplab bench --groups schedule --smoke on CPU: the surface, the schedule file (loaded by
    the knob), the gain line; a second run with the same folder resumes (measures nothing)."""
    from mtplab.studies.bench import grid_doc
    from mtplab.studies.spec_schedule.runner import run_group
    text = run_group(grid_doc("schedule"), tmp_path, device="cpu", smoke=True)
    assert "#### random-tiny" in text and "| bs | off tok/s | 1x1 tok/s (vs off) | best |" in text
    assert "gain on the varying workload" in text and "one repeat, no verdict" in text
    (f,) = tmp_path.glob("*.schedule.yaml")
    cfg = RunConfig(model="random-tiny", draft="frozen_kv_mtp", max_running_requests=2,
                    spec_schedule=str(f))
    assert set(cfg.spec_schedule) == {2} or set(cfg.spec_schedule) == {1, 2}
    saved = (tmp_path / "results.json").read_text()
    assert run_group(grid_doc("schedule"), tmp_path, device="cpu", smoke=True) == text
    assert (tmp_path / "results.json").read_text() == saved


def test_a_device_holding_one_engine_times_the_gain_one_engine_after_the_other(
        tmp_path, monkeypatch):
    """The gain's second engine does not fit (InsufficientMemoryError): the first runs its
    rounds and is closed, then the second is built; the report says so, and every engine
    built is closed."""
    from mtplab.models.memory import InsufficientMemoryError
    from mtplab.studies.bench import grid_doc
    from mtplab.studies.spec_schedule import runner
    built, real = [], runner._Group._engine

    def closed(e) -> bool:
        return e.__dict__.get("_closed", True)

    def engine(self, m, sched):
        if not all(map(closed, built)) and "_gain" in callers():
            raise InsufficientMemoryError("needs about 54.60 GiB but only 27.29 GiB is free")
        built.append(real(self, m, sched))
        return built[-1]
    monkeypatch.setattr(runner._Group, "_engine", engine)
    text = runner.run_group(grid_doc("schedule"), tmp_path, device="cpu", smoke=True)
    gain = json.loads((tmp_path / "results.json").read_text())["random-tiny"]["gain"]
    assert gain["order"] == "one after the other" and len(gain["ratios"]) == 1
    assert "round(s) of one engine, then of the other (the device holds one engine" in text
    assert all(map(closed, built))


def callers() -> set:
    import inspect
    return {f.function for f in inspect.stack()}


def test_best_schedule_merges_equal_neighbours(tmp_path):
    from mtplab.studies.spec_schedule.runner import _Group
    doc = dict(models=[{"model": "random-tiny"}], arms=["off", [1, 1], [3, 1]],
               batch_sizes=[1, 2, 4, 8], surface={}, workload={})
    g = _Group(doc, tmp_path, device="cpu", smoke=False, quick=False, repeats=1, bs=None,
               deadline=None)
    tps = {"off": [1, 2, 5, 9], "1x1": [2, 3, 4, 6], "3x1": [3, 2.5, 1, 1]}
    r = {"surface": {n: {str(b): [v] for b, v in zip(g.bs, vs)} for n, vs in tps.items()}}
    assert g.best_schedule(r) == {1: (3, 1), 2: (1, 1), 8: "off"}


def test_best_schedule_keeps_the_static_setting_within_min_gain(tmp_path):
    """The best static setting (of the workload) stays where another beats it by <= 5%."""
    from mtplab.studies.spec_schedule.runner import _Group
    doc = dict(models=[{"model": "random-tiny"}], arms=["off", [3, 1], [5, 1]],
               batch_sizes=[1, 4, 32], surface={}, workload={}, min_gain=0.05)
    g = _Group(doc, tmp_path, device="cpu", smoke=False, quick=False, repeats=1, bs=None,
               deadline=None)
    tps = {"off": [1, 1, 200], "3x1": [100, 100, 100], "5x1": [104, 120, 90]}
    r = {"surface": {n: {str(b): [v] for b, v in zip(g.bs, vs)} for n, vs in tps.items()},
         "workload": {"off": [5], "3x1": [10], "5x1": [9]}}
    assert g.best_schedule(r) == {1: (3, 1), 4: (5, 1), 32: "off"}
    g.min_gain = 0.25
    assert g.best_schedule(r) == {4: (3, 1), 32: "off"}
