"""Overlap scheduler: identical tokens with overlap off / on / on + zero_bubble, a randomized
request stream with arrivals, EOS and limits inside accepted runs, aborts and KV pressure,
the future map's consume-once debug mode, and forward isolation."""
import random
import time

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.device import resolve_device
from mtplab.kernels.attn_meta import AttnBoundError
from mtplab.sched.future_map import FutureMap, FutureMapError
from mtplab.sched.rows import Batch
from mtplab.core import DraftInputs
from tests.helpers import make_agreeable, random_prompts, reference_outputs

# the future map's row-move kernel runs on CUDA, or on CPU through the Triton interpreter
KERNEL_DEV = "cuda" if torch.cuda.is_available() else "cpu"

PROMPTS = random_prompts(6, [1, 7, 30, 90], 320, seed=21)
MAX_NEW = [19, 6, 25, 11, 2, 14]

LOOPS = {"off": dict(overlap=False), "on": dict(overlap=True),
         "on+zb": dict(overlap=True, zero_bubble=True)}


def run(cfg_kw, loop, arrivals=None, stop_ids=frozenset(), agreeable=True):
    eng = Engine(RunConfig(model="random-tiny", max_running_requests=3, debug_invariants=True,
                           debug_future_map=True, **cfg_kw, **LOOPS[loop]))
    if agreeable:
        make_agreeable(eng)
    add = [(p, m) for p, m in zip(PROMPTS, MAX_NEW)]
    reqs = [eng.add_request(p, m, stop_ids=stop_ids, ignore_eos=True) for p, m in add[:3]]
    sched = eng.scheduler
    step = 0
    while not sched.idle or step < 4:
        if step == 3:                 # arrivals while others decode
            reqs += [eng.add_request(p, m, stop_ids=stop_ids, ignore_eos=True) for p, m in add[3:]]
        eng.step()
        eng.check_invariants()
        step += 1
    eng.check_invariants()
    assert eng.allocator.free_pages == eng.allocator.total_pages
    return [r.output_ids for r in reqs], sched.stats


SPEC_GRID = [dict(draft="none", page_size=1), dict(draft="none", page_size=16)] + [
    dict(draft=d, page_size=P, topk=K, num_steps=3, num_draft_tokens=4 if K == 1 else 8,
         fold_seed=f)
    for d in ("frozen_kv_mtp", "eagle") for P in (1, 16) for K in (1, 4)
    for f in ((False, True) if d == "frozen_kv_mtp" else (False,))]


# The default (fast) set keeps one arm per draft kind; the rest run with `-m slow`.
FAST_OVERLAP = ({"draft": "none", "page_size": 16},
                {"draft": "frozen_kv_mtp", "page_size": 16, "topk": 4, "num_steps": 3,
                 "num_draft_tokens": 8, "fold_seed": True},
                {"draft": "eagle", "page_size": 16, "topk": 4, "num_steps": 3,
                 "num_draft_tokens": 8, "fold_seed": False})


_TARGET_ONLY: dict = {}


def target_only(agreeable: bool) -> list[list[int]]:
    """The dense no-cache greedy output of the target (make_agreeable's or the random one)."""
    if agreeable not in _TARGET_ONLY:
        eng = Engine(RunConfig(model="random-tiny"))
        if agreeable:
            make_agreeable(eng)
        _TARGET_ONLY[agreeable] = reference_outputs(eng.model, PROMPTS, MAX_NEW)
    return _TARGET_ONLY[agreeable]


@pytest.mark.parametrize("agreeable", [True, False], ids=["agreeable", "random"])
@pytest.mark.parametrize("cfg", [c if c in FAST_OVERLAP else pytest.param(c, marks=pytest.mark.slow)
                                 for c in SPEC_GRID],
                         ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_identical_tokens_overlap_off_on_zero_bubble(cfg, agreeable):
    """Every loop gives the target-only tokens: on "agreeable" weights (long accepted runs,
    compaction at topk > 1) and on the plain random ones, whose attention is not damped (a
    KV entry lost or misplaced changes the tokens)."""
    ref = target_only(agreeable)
    for loop in LOOPS:
        assert run(cfg, loop, agreeable=agreeable)[0] == ref, loop


@pytest.mark.parametrize("draft", ["none", "frozen_kv_mtp", "eagle"])
def test_overlap_gives_target_only_tokens_on_random_weights(draft):
    """Without the debug checks (no bound check in attention, no consume-once map): the
    overlap loop's tokens are the target's on weights whose attention is not damped, so a
    lost or misplaced KV entry shows in the tokens themselves."""
    eng = Engine(RunConfig(model="random-tiny", draft=draft, overlap=True, page_size=16,
                           max_running_requests=6))
    reqs = [eng.add_request(p, m, ignore_eos=True) for p, m in zip(PROMPTS, MAX_NEW)]
    while not eng.idle:
        eng.step()
    assert [r.output_ids for r in reqs] == target_only(False)


@pytest.mark.parametrize("draft", ["none", "eagle"])
def test_debug_mode_catches_a_host_kv_bound_that_forgets_the_step_in_flight(draft):
    """debug_invariants checks every attention call's kv_len <= max_kv: the overlap loop's
    host lengths lag one step (a draft's: with zb_device_seq_lens, else the host reads
    them), so a bound without the in-flight advance is too small."""
    eng = Engine(RunConfig(model="random-tiny", draft=draft, overlap=True, zero_bubble=True,
                           debug_invariants=True))
    make_agreeable(eng, eps=0.0)                # every draft accepted: the most in flight
    eng.scheduler.lag = 0                       # the planted bug
    with pytest.raises(AttnBoundError, match="max_kv"):
        eng.generate(PROMPTS[:3], max_new_tokens=6, ignore_eos=True)


@pytest.mark.parametrize("draft", ["none", "frozen_kv_mtp", "eagle"])
def test_overlap_launches_a_step_before_it_processes_the_decode_before(draft):
    """Under overlap, iteration k launches step k before it processes step k-1's results
    whenever k-1 was a decode: the host's result processing runs while the device computes
    step k. A recorder around the scheduler's launch and process_result, per iteration (no
    KV pressure here: a decode that cannot get its reserve drains first, on purpose)."""
    eng = Engine(RunConfig(model="random-tiny", draft=draft, overlap=True,
                           max_running_requests=6))
    sched, log = eng.scheduler, []
    launch, process = sched._launch, sched.process_result

    def rec_launch(kind, batch):
        p = launch(kind, batch)
        log.append(("launch", p))
        return p

    def rec_process(p):
        log.append(("process", p))
        process(p)
    sched._launch, sched.process_result = rec_launch, rec_process
    for p, m in zip(PROMPTS, MAX_NEW):
        eng.add_request(p, m, ignore_eos=True)
    processed_after = 0
    while not eng.idle:
        log.clear()
        eng.step()
        ev = [e for e, _ in log]
        for i, (e, p) in enumerate(log):
            if e == "process" and p.kind == "decode" and "launch" in ev:
                assert ev.index("launch") < i, "a decode's results were processed before " \
                    "the next step was launched: the overlap loop ran serially"
                assert p is not log[ev.index("launch")][1]
                processed_after += 1
    assert sched.stats.decode_steps >= 10 and processed_after >= sched.stats.decode_steps - 2


def test_zero_bubble_predrafts_the_next_round():
    _, st = run(dict(draft="frozen_kv_mtp", num_steps=3), "on+zb")
    _, st_on = run(dict(draft="frozen_kv_mtp", num_steps=3), "on")
    assert st.predrafted_steps > 0 and st_on.predrafted_steps == 0


def test_a_decode_is_predrafted_when_every_row_was_decoded_since_its_prefill():
    """The worker owns pre-drafting: a decode starts at `tree` only on rows whose draft it
    ran in their last decode (a subset of the last batch too), never on a freshly prefilled
    row."""
    eng = Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", zero_bubble=True))
    st = eng.scheduler.stats

    def decode_predrafted() -> bool:
        d0, p0 = st.decode_steps, st.predrafted_steps
        eng.step()
        assert st.decode_steps == d0 + 1
        return st.predrafted_steps == p0 + 1
    a = eng.add_request([5, 6, 7], 40, ignore_eos=True)
    eng.add_request([8, 9], 40, ignore_eos=True)
    eng.step()                                           # both prefills
    assert [decode_predrafted() for _ in range(3)] == [False, True, True]
    eng.abort(a)                                         # a subset of the last batch
    assert decode_predrafted()
    eng.add_request([4], 40, ignore_eos=True)
    eng.step()                                           # its prefill
    assert [decode_predrafted() for _ in range(2)] == [False, True]
    eng.check_invariants()


@pytest.mark.parametrize("draft", ["none", "frozen_kv_mtp", "eagle"])
@pytest.mark.parametrize("device_seq_lens", [False, True])
def test_publish_ready_follows_every_publish_the_host_reads(draft, device_seq_lens):
    """Overlap with zb_device_seq_lens off and a draft: the host reads the lengths behind
    `publish_ready`, so every step that publishes records it after its publish (prefills
    and every decode); with the lengths on the device, or without a draft (the host knows
    the lengths: one token per step), never."""
    eng = Engine(RunConfig(model="random-tiny", draft=draft, overlap=True,
                           zb_device_seq_lens=device_seq_lens))

    class Recorded:
        n = 0

        def record(self, stream=None):
            Recorded.n += 1
    eng.future_map.publish_ready = Recorded()
    eng.generate([[5, 6, 7], [8, 9]], max_new_tokens=6, ignore_eos=True)
    st = eng.scheduler.stats
    reads = not device_seq_lens and draft != "none"
    assert Recorded.n == (st.prefill_steps + st.decode_steps if reads else 0)
    eng.check_invariants()


@pytest.mark.parametrize("draft", ["none", "eagle"])
def test_length_finish_is_not_scheduled_again(draft):
    """max_new_tokens known to be reached by the step in flight: no overshoot step."""
    eng = Engine(RunConfig(model="random-tiny", draft=draft, overlap=True,
                           simulate_accept_len=1.0 if draft != "none" else None))
    out = eng.generate([[5, 6, 7]], max_new_tokens=4, ignore_eos=True)
    st = eng.scheduler.stats
    assert len(out[0]) == 4 and st.decode_steps == 3 and st.overshoot_rows == 0
    eng.check_invariants()


def random_stream(loop: str, seed: int, draft: str, sim):
    """Hundreds of requests, seeded: arrivals during decode, varied lengths, EOS inside
    accepted runs, length limits inside accepted runs, aborts, KV pressure."""
    rng = random.Random(seed)
    eng = Engine(RunConfig(model="random-tiny", draft=draft, num_steps=3, page_size=4,
                           simulate_accept_len=sim, context_len=160, max_running_requests=8,
                           max_total_tokens=3 * 168, debug_invariants=True,
                           debug_future_map=True, **LOOPS[loop]))
    make_agreeable(eng)
    sched = eng.scheduler
    specs = []
    for _ in range(200):
        plen = rng.choice([1, 3, 12, 40, 60])
        prompt = [rng.randrange(3, 320) for _ in range(plen)]
        stop = frozenset({rng.randrange(3, 320) for _ in range(12)})     # EOS-like stops
        specs.append((prompt, rng.choice([1, 2, 5, 17, 40, 90]), stop))
    arrivals = {i: rng.randrange(0, 150) for i in range(len(specs))}
    aborts = {i: arrivals[i] + 2 for i in rng.sample(range(len(specs)), 10)}
    reqs = [None] * len(specs)
    step = 0
    while step < 2000:
        for i, t in arrivals.items():
            if t == step:
                prompt, m, stop = specs[i]
                reqs[i] = eng.add_request(prompt, m, stop_ids=stop, ignore_eos=True)
        for i, t in aborts.items():
            if t == step:
                eng.abort(reqs[i].rid)
        if sched.idle and step > max(arrivals.values()):
            break
        eng.step()
        assert_live_identity_lagging(eng)
        step += 1
    eng.check_invariants()
    assert eng.allocator.free_pages == eng.allocator.total_pages
    assert all(r.finished for r in reqs), "a request was lost"
    return reqs, sched.stats


def assert_live_identity_lagging(eng):
    inflight = set(map(id, eng.scheduler.in_flight.reqs)) if eng.scheduler.in_flight else set()
    for r in eng.scheduler.running:
        if id(r) not in inflight:
            assert len(r.prompt_ids) + len(r.output_ids) == r.kv.kv_committed_len + 1


@pytest.mark.slow
@pytest.mark.parametrize("draft,sim", [("none", None), ("frozen_kv_mtp", None),
                                       ("eagle", None), ("frozen_kv_mtp", 1.0),
                                       ("eagle", 4.0)])
def test_random_request_stream_equals_synchronous_loop(draft, sim):
    sync_reqs, sst = random_stream("off", 7, draft, sim)
    ovl_reqs, ost = random_stream("on+zb", 7, draft, sim)
    assert sst.retractions > 0 or ost.retractions > 0, "no KV pressure exercised"
    assert sst.overshoot_rows == 0 and ost.overshoot_rows > 0, "no overshoot step exercised"
    for a, b in zip(sync_reqs, ovl_reqs):
        if sim is not None and (a.num_retractions or b.num_retractions):
            # Simulated acceptance commits draft tokens (as SGLang's does); a re-prefill after
            # a retraction feeds target tokens instead, so the two histories legitimately
            # diverge when only one loop retracted the request. Greedy verify has no such
            # freedom: there every request must match.
            continue
        if a.finished_reason == "abort" or b.finished_reason == "abort":
            n = min(len(a.output_ids), len(b.output_ids))
            assert a.output_ids[:n] == b.output_ids[:n]
        else:
            assert a.output_ids == b.output_ids and a.finished_reason == b.finished_reason
    reasons = {r.finished_reason for r in ovl_reqs}
    assert {"stop", "length", "abort"} <= reasons


def test_future_map_resolve_into_gives_padding_lanes_the_pad_value():
    """A captured resolve's one kernel (the interpreter on CPU): real rows read their entries
    (+ add), padding lanes (row 0) read the pad value whatever padding lanes last wrote into
    row 0."""
    with torch.device(KERNEL_DEV):   # the interpreter on CPU, else the GPU
        fm = FutureMap(4, 3, 2, torch.float32, resolve_device(KERNEL_DEV), with_topk=False)
        fm.publish(torch.tensor([0, 2]), torch.tensor([77, 5]))         # row 0: a padding write
        fm.stash(torch.tensor([0, 2]), DraftInputs(torch.tensor([9, 4]), torch.full((2, 3), 8.0)))
        rows = torch.tensor([2, 0, 0])
        kv, bonus, hidden = torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long), \
            torch.ones(3, 3)
        fm.resolve_into(rows, [(kv, "seq_lens", 1, 1), (bonus, "bonus", 0, 0),
                               (hidden, "hidden", 0, 0)])
        assert kv.tolist() == [6, 1, 1] and bonus.tolist() == [4, 0, 0]
        assert hidden.tolist() == [[8.0] * 3, [0.0] * 3, [0.0] * 3]


def test_future_map_write_eager_marks_each_stage_and_matches_the_fused_kernel():
    """A segment's tail: eagerly `mark` begins publish then stash and the plain ops run; in a
    graph (`mark.captured`) one kernel does the same moves and takes the stamps still to come."""
    class Eager(list):
        captured = False

        def __call__(self, name):
            self.append(name)

    class Fused(list):
        captured = True

        def carry(self, *names):
            self.extend(names)
            return None                 # no meter: the kernel stamps nothing

    with torch.device(KERNEL_DEV):   # the interpreter on CPU, else the GPU
        rows, seq = torch.tensor([3, 1]), torch.tensor([11, 12])
        x = DraftInputs(torch.tensor([5, 6], dtype=torch.int32), torch.randn(2, 3))
        maps = [FutureMap(4, 3, 2, torch.float32, resolve_device(KERNEL_DEV), with_topk=False,
                          num_candidates=4)
                for _ in range(2)]
        marks = [Eager(), Fused()]
        for fm, m in zip(maps, marks):
            fm.write(rows, m, seq_lens=seq, inputs=x)
        assert marks[0] == marks[1] == ["publish", "stash"]
        for f in ("seq_lens", "bonus", "hidden"):
            assert torch.equal(getattr(maps[0], f), getattr(maps[1], f))
        assert maps[0].bonus[rows].tolist() == [5, 6]
        assert maps[0].seq_lens[rows].tolist() == [11, 12]
        cands = (torch.randn(2, 4), torch.randint(0, 9, (2, 4)), torch.randint(-1, 3, (2, 4)))
        for fm, m in zip(maps, (Eager(), Fused())):
            fm.write(rows, m, predraft=cands)
            assert m == ["stash"]
        for f in ("pre_scores", "pre_tokens", "pre_parents"):
            assert torch.equal(getattr(maps[0], f), getattr(maps[1], f))


def test_future_map_poison_catches_a_stale_resolve():
    fm = FutureMap(4, 8, 2, torch.float32, resolve_device("cpu"), with_topk=False, poison=True)
    rows = torch.tensor([1, 3])
    with pytest.raises(FutureMapError, match="without a fresh publish"):
        fm.resolve_seq_lens(rows)
    fm.publish(rows, torch.tensor([5, 9]))
    assert fm.resolve_seq_lens(rows).tolist() == [5, 9]
    with pytest.raises(FutureMapError, match="consume-once"):
        fm.resolve_seq_lens(rows)                  # read twice without a new publish
    fm.stash(rows, DraftInputs(torch.tensor([7, 8]), torch.ones(2, 8)))
    assert fm.gather(rows).bonus.tolist() == [7, 8]
    # row 0 (graph padding) is never poisoned
    assert fm.resolve_seq_lens(torch.tensor([0])).tolist() == [-1]


def test_future_map_filter_and_merge_move_only_indices():
    fm = FutureMap(6, 4, 2, torch.float32, resolve_device("cpu"), with_topk=True)
    ptrs = [t.data_ptr() for t in (fm.seq_lens, fm.bonus, fm.hidden)]
    fm.publish(torch.tensor([1, 2, 3, 4]), torch.tensor([10, 20, 30, 40]))
    fm.stash(torch.tensor([1, 2, 3, 4]), DraftInputs(torch.tensor([1, 2, 3, 4]),
                                                     torch.arange(16.).view(4, 4),
                                                     torch.zeros(4, 2), torch.zeros(4, 2)))
    merged = torch.tensor([4, 1])                  # a filtered + reordered batch: indices only
    assert fm.resolve_seq_lens(merged).tolist() == [40, 10]
    assert fm.gather(merged).hidden[0].tolist() == [12., 13., 14., 15.]
    assert ptrs == [t.data_ptr() for t in (fm.seq_lens, fm.bonus, fm.hidden)]


def test_forward_isolation_inputs_unchanged_by_the_worker():
    eng = Engine(RunConfig(model="random-tiny", draft="eagle", topk=2, num_draft_tokens=5))
    eng.generate([[5, 6, 7]], max_new_tokens=2, ignore_eos=True)
    sched = eng.scheduler
    r = eng.add_request([5, 6, 7, 8], 6, ignore_eos=True)
    eng.step()                                     # prefill
    x = sched._prepare_decode(Batch.of([r]))
    snap = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in vars(x).items()}
    eng.worker.decode(x)
    for k, v in vars(x).items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, snap[k]), k
        elif k != "sampling":
            assert v == snap[k], k


@pytest.mark.parametrize("overlap", [False, True])
def test_decode_time_leaves_out_the_wait_for_the_prefill(monkeypatch, overlap):
    """Under overlap the iteration that launches the first decode waits for the prefill's
    results: that wait is prefill time, not decode time (a long prefill otherwise lowers
    decode tok/s of the overlap loop only)."""
    # the wait dwarfs 5 decode steps of random-tiny however busy the host (a 2-core machine
    # under load runs them in well under a second)
    WAIT_S = 2.0
    from mtplab.sched import d2h as d2h_mod
    read = d2h_mod.Pending.read

    def slow_prefill(self):
        if self.kind == "prefill":
            time.sleep(WAIT_S)              # the host waits for a long prefill forward
        return read(self)
    monkeypatch.setattr(d2h_mod.Pending, "read", slow_prefill)
    eng = Engine(RunConfig(model="random-tiny", overlap=overlap, zero_bubble=overlap))
    eng.generate([[5, 6, 7], [8, 9]], max_new_tokens=6, ignore_eos=True)
    st, s = eng.stats(), eng.scheduler.stats
    assert st["decode_steps"] == len(s.decode_step_times_s) == 5
    assert s.decode_time_s < WAIT_S and max(s.step_times_s) >= WAIT_S
    eng.check_invariants()


@pytest.mark.parametrize("overlap", [False, True])
def test_a_blocking_read_waits_for_the_stream_that_writes_the_results(monkeypatch, overlap):
    """zb_async_d2h=false: before `.tolist()` the host waits for the forward stream, which
    under overlap is not the current stream (sched/d2h.py; on CUDA a read on the current
    stream would not wait for it: tests/gpu/test_d2h_gpu.py runs it with that stream late)."""
    eng = Engine(RunConfig(model="random-tiny", overlap=overlap, zb_async_d2h=False))
    fwd = eng.scheduler.forward_stream
    waited: list = []
    monkeypatch.setattr(type(fwd), "synchronize", lambda s: waited.append(s is fwd))
    eng.generate([[5, 6, 7], [8, 9]], max_new_tokens=6, ignore_eos=True)
    st = eng.stats()
    assert waited.count(True) == st["decode_steps"] + st["prefill_steps"], waited
    eng.check_invariants()
