"""Engine lifetime: `del eng` frees the engine at once (no reference cycle reaches it, so the
cyclic collector is never needed), `close()` / `with` free what it holds, and the scheduler
keeps nothing per finished request. Every test runs with the garbage collector disabled: an
engine that needed it would stay alive."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.engine import EngineClosedError
from mtplab.nogc import gc_paused
from mtplab.sched.hooks import StepHookError


def leftover_cycles() -> list[str]:
    """mtplab objects and tensors that only the cyclic collector would free (collected now)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                        if isinstance(o, torch.Tensor)
                        or (type(o).__module__ or "").startswith("mtplab")})
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
    return found


def run_one(**kw) -> Engine:
    eng = Engine(RunConfig(model="random-tiny", device="cpu", **kw))
    eng.generate([[1, 2, 3], [4, 5, 6, 7]], max_new_tokens=6)
    eng.check_invariants()
    return eng


CASES = {
    "target-only": {},
    "target-only overlap": dict(overlap=True),
    "frozen": dict(draft="frozen_kv_mtp"),
    "frozen overlap zero_bubble": dict(draft="frozen_kv_mtp", overlap=True, zero_bubble=True),
    "eagle topk 2": dict(draft="eagle", topk=2, num_draft_tokens=4),
    "eagle overlap": dict(draft="eagle", overlap=True),
    "meter timeline": dict(draft="frozen_kv_mtp", overlap=True, bubble_meter=True,
                           event_timeline=True),
    "debug_invariants": dict(draft="eagle", debug_invariants=True),
}


@pytest.mark.parametrize("kw", CASES.values(), ids=CASES.keys())
def test_del_frees_the_engine_without_the_cycle_collector(kw):
    with gc_paused(collect=True):
        eng = run_one(**kw)
        ref = weakref.ref(eng)
        del eng
        assert ref() is None
        assert leftover_cycles() == []


def test_del_frees_a_profiled_engine_and_stops_its_profiler(tmp_path):
    with gc_paused(collect=True):
        eng = run_one(profile=True, profile_wait=1, profile_warmup=1, profile_active=100,
                      trace_dir=str(tmp_path), run_name="p")
        ref = weakref.ref(eng)
        del eng
        assert ref() is None
        assert leftover_cycles() == []
        assert not torch.autograd._profiler_enabled()                # the session stopped
        assert list((tmp_path / "p").glob("*.pt.trace.json.gz"))      # its window, written


def test_del_after_an_error_inside_generate_frees_the_engine():
    with gc_paused(collect=True):
        eng = Engine(RunConfig(model="random-tiny", device="cpu", draft="frozen_kv_mtp",
                               overlap=True))

        def boom(i):
            if i == 3:
                raise ValueError("planted")
        eng.on_step(boom)
        try:
            eng.generate([[1, 2, 3]], max_new_tokens=8)
        except StepHookError:
            pass
        eng.check_invariants()
        ref = weakref.ref(eng)
        del eng
        assert ref() is None
        assert leftover_cycles() == []


def test_close_is_idempotent_and_with_closes():
    with Engine(RunConfig(model="random-tiny", device="cpu")) as eng:
        out = eng.generate([[1, 2, 3]], max_new_tokens=4)
        eng.check_invariants()
    assert len(out[0]) == 4 and eng.stats()["tokens"] == 4      # the figures stay readable
    eng.close()
    for use in (lambda: eng.generate([[1, 2]], max_new_tokens=2), lambda: eng.idle,
                lambda: eng.add_request([1, 2]), lambda: eng.kv_cache):
        with pytest.raises(EngineClosedError, match="this Engine is closed"):
            use()


def test_close_aborts_held_requests_and_frees_the_kv_pool():
    eng = Engine(RunConfig(model="random-tiny", device="cpu", overlap=True))
    req = eng.add_request([1, 2, 3], max_new_tokens=20)
    eng.step()
    eng.step()
    eng.check_invariants()
    kv = weakref.ref(eng.kv_cache.k)
    eng.close()
    assert req.finished_reason == "abort"
    assert kv() is None


def test_scheduler_keeps_no_finished_request():
    eng = Engine(RunConfig(model="random-tiny", device="cpu", draft="frozen_kv_mtp"))
    for _ in range(30):
        eng.generate([[1, 2, 3], [4, 5]], max_new_tokens=2)
    eng.check_invariants()
    assert len(eng.scheduler.finished) <= 2
    req = eng.add_request([1, 2, 3], max_new_tokens=3)
    done = []
    while not eng.idle:
        done += eng.step()
    assert done == [req] and eng.scheduler.finished == [req]


def test_a_hook_can_be_removed():
    eng = Engine(RunConfig(model="random-tiny", device="cpu"))
    seen = []
    handle = eng.on_step(seen.append)
    eng.generate([[1, 2, 3]], max_new_tokens=3)
    n = len(seen)
    assert n > 0 and handle.remove() and not handle.remove()
    eng.generate([[1, 2, 3]], max_new_tokens=3)
    assert len(seen) == n
    eng.check_invariants()


def test_a_raising_hook_fails_one_generate_and_is_removed():
    eng = Engine(RunConfig(model="random-tiny", device="cpu", draft="frozen_kv_mtp",
                           overlap=True))
    kept = []
    eng.on_step(kept.append)

    def bad(i):
        raise KeyError("oops")
    eng.on_step(bad)
    with pytest.raises(StepHookError, match=r"on_step hook .*bad raised KeyError at step 0: "
                                            r"'oops'; it is removed"):
        eng.generate([[1, 2, 3]], max_new_tokens=4)
    eng.check_invariants()                               # its requests were aborted, KV freed
    want = Engine(RunConfig(model="random-tiny", device="cpu")).generate([[1, 2, 3]],
                                                                         max_new_tokens=4)
    assert eng.generate([[1, 2, 3]], max_new_tokens=4) == want     # later generates run
    assert kept[:2] == [0, 1]                             # the good hook stays
    eng.check_invariants()


def test_abort_takes_the_request_handle():
    eng = Engine(RunConfig(model="random-tiny", device="cpu", overlap=True))
    a = eng.add_request([1, 2, 3], max_new_tokens=50)
    b = eng.add_request([4, 5, 6], max_new_tokens=5)
    eng.step()
    eng.step()
    assert eng.abort(a) and a.finished_reason == "abort"
    assert not eng.abort(a)                              # gone: False, as for a rid
    eng.check_invariants()
    while not eng.idle:
        eng.step()
    assert b.finished_reason == "length" and len(a.output_ids) < 50
    eng.check_invariants()
    other = Engine(RunConfig(model="random-tiny", device="cpu"))
    c = other.add_request([1, 2], max_new_tokens=3)
    assert c.rid == 0 and not eng.abort(c)               # another engine's handle: not ours
    other.check_invariants()
    for bad in ("0", 1.0, True, None):
        with pytest.raises(TypeError, match="abort takes a request handle"):
            eng.abort(bad)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.slow
def test_rss_is_flat_over_twenty_engines():
    """Each engine holds a 64 MiB KV pool; twenty of them must not add up."""
    kw = dict(draft="frozen_kv_mtp", overlap=True, max_total_tokens=32768)
    with gc_paused(collect=True):
        sizes = []
        for _ in range(23):
            eng = run_one(**kw)
            del eng
            sizes.append(rss_mib())
    assert sizes[-1] - sizes[2] < 32, sizes
