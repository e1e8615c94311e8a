"""Fault injection: an error or Ctrl-C anywhere inside a step frees everything it held.

For every loop mode and draft, raise at a random point of a random step (schedule, prepare,
the worker's forward, d2h, process_result), as an error and as KeyboardInterrupt. Afterwards
check_invariants() is clean, every page and row is free, and the next generate equals a fresh
engine's output. Also: the public abort, the stall guard, and an unwritable trace folder.
"""
from __future__ import annotations

import random
import zlib

import pytest

from mtplab import Engine, RunConfig
from mtplab.sched.scheduler import SchedulerStallError
from tests.helpers import random_prompts

LOOPS = {"off": dict(overlap=False), "on": dict(overlap=True),
         "on+zb": dict(overlap=True, zero_bubble=True)}
DRAFTS = {"none": dict(draft="none"),
          "frozen": dict(draft="frozen_kv_mtp", topk=2, num_steps=2, num_draft_tokens=4),
          "eagle": dict(draft="eagle", topk=2, num_steps=2, num_draft_tokens=4)}
PROMPTS = random_prompts(3, [5, 11, 3], 300, seed=4)
POINTS = ("schedule", "prepare", "forward", "d2h", "process_result")


class Injected(RuntimeError):
    pass


def cfg(loop: str, draft: str) -> RunConfig:
    return RunConfig(model="random-tiny", page_size=4, max_running_requests=2,
                     **LOOPS[loop], **DRAFTS[draft])


def arm(eng: Engine, point: str, at_call: int, exc: type[BaseException]) -> None:
    """Make the `at_call`-th call of `point` raise `exc` (instance attributes only)."""
    sched, calls = eng.scheduler, [0]

    def wrap(fn):
        def f(*a, **k):
            calls[0] += 1
            if calls[0] == at_call:
                raise exc("injected")
            return fn(*a, **k)
        return f

    if point == "forward":
        eng.worker.decode = wrap(eng.worker.decode)
        eng.worker.prefill = wrap(eng.worker.prefill)
    elif point == "prepare":
        sched._prepare_decode = wrap(sched._prepare_decode)
    elif point == "d2h":
        eng._restore = sched.d2h
        sched.d2h = wrap(sched.d2h)
    else:
        setattr(sched, point, wrap(getattr(sched, point)))


def disarm(eng: Engine) -> None:
    for k in ("schedule", "process_result", "_prepare_decode"):
        eng.scheduler.__dict__.pop(k, None)
    for k in ("decode", "prefill"):
        eng.worker.__dict__.pop(k, None)
    if hasattr(eng, "_restore"):
        eng.scheduler.d2h = eng._restore


def assert_all_free(eng: Engine) -> None:
    eng.check_invariants()
    assert eng.allocator.free_pages == eng.allocator.total_pages
    assert eng.pool.free_rows == eng.cfg.max_running_requests
    assert eng.idle


_FRESH: dict = {}


def fresh(loop: str, draft: str) -> list[list[int]]:
    if (loop, draft) not in _FRESH:
        _FRESH[loop, draft] = Engine(cfg(loop, draft)).generate(PROMPTS, max_new_tokens=7,
                                                                ignore_eos=True)
    return _FRESH[loop, draft]


def inject_and_recover(loop: str, draft: str, exc: type[BaseException], seed: int) -> None:
    rng = random.Random(seed)
    eng = Engine(cfg(loop, draft))
    point, at_call = rng.choice(POINTS), rng.randrange(1, 6)
    arm(eng, point, at_call, exc)
    try:
        with pytest.raises(exc, match="injected"):
            eng.generate(PROMPTS, max_new_tokens=7, ignore_eos=True)
    finally:
        disarm(eng)
    assert_all_free(eng)
    assert eng.generate(PROMPTS, max_new_tokens=7, ignore_eos=True) == fresh(loop, draft)
    assert_all_free(eng)


@pytest.mark.parametrize("exc", [Injected, KeyboardInterrupt])
@pytest.mark.parametrize("loop,draft", [("off", "none"), ("on+zb", "frozen"), ("on", "eagle")])
def test_fault_inside_a_step_frees_everything(loop, draft, exc):
    # crc32, not hash(): the injection point is the same in every process (str hashes are
    # randomised per process)
    inject_and_recover(loop, draft, exc, seed=zlib.crc32(f"{loop}/{draft}/{exc.__name__}".encode()))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("exc", [Injected, KeyboardInterrupt])
@pytest.mark.parametrize("draft", sorted(DRAFTS))
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_fault_grid_every_loop_and_draft(loop, draft, exc, seed):
    inject_and_recover(loop, draft, exc, seed)


@pytest.mark.parametrize("point", POINTS)
def test_every_injection_point_is_reached(point):
    """Each point raises when armed at its first call: the suite cannot pass vacuously."""
    eng = Engine(cfg("on", "frozen"))
    arm(eng, point, 1, Injected)
    try:
        with pytest.raises(Injected):
            eng.generate(PROMPTS, max_new_tokens=4, ignore_eos=True)
    finally:
        disarm(eng)
    assert_all_free(eng)


def test_bad_sampling_seed_leaks_nothing_and_the_next_call_runs():
    eng = Engine(RunConfig(model="random-tiny", context_len=128, max_running_requests=1))
    with pytest.raises((ValueError, OverflowError, RuntimeError)):
        eng.generate([[5, 6, 7]], max_new_tokens=4, temperature=1.0, seed=2**70)
    assert_all_free(eng)
    assert len(eng.generate([[5, 6, 7]], max_new_tokens=4, ignore_eos=True)[0]) == 4


def test_public_abort_frees_kv_and_keeps_the_output_so_far():
    eng = Engine(cfg("on", "frozen"))
    a = eng.add_request(PROMPTS[0], 30, ignore_eos=True)
    b = eng.add_request(PROMPTS[1], 5, ignore_eos=True)
    for _ in range(3):
        eng.step()
    assert eng.abort(a.rid) and not eng.abort(10_000)
    while not eng.idle:
        eng.step()
    assert a.finished_reason == "abort" and 0 < len(a.output_ids) < 30
    assert b.finished_reason == "length" and len(b.output_ids) == 5
    assert_all_free(eng)


def test_no_progress_raises_instead_of_spinning():
    eng = Engine(RunConfig(model="random-tiny", max_running_requests=2))
    leaked = eng.allocator.alloc_pages(eng.allocator.free_pages)      # a leak, planted
    with pytest.raises(SchedulerStallError, match="no progress"):
        eng.generate([[5, 6, 7]], max_new_tokens=4)
    eng.allocator.free_pages_list(leaked)
    assert_all_free(eng)
    assert len(eng.generate([[5, 6, 7]], max_new_tokens=4, ignore_eos=True)[0]) == 4


def test_unwritable_trace_folder_frees_kv(tmp_path):
    blocker = tmp_path / "file"
    eng = Engine(RunConfig(model="random-tiny", profile=True, profile_wait=0, profile_warmup=0,
                           profile_active=1, trace_dir=str(blocker), run_name="r"))
    blocker.write_text("not a folder")        # after Engine(), which checks the run folder
    with pytest.raises(OSError):
        eng.generate(PROMPTS, max_new_tokens=6, ignore_eos=True)
    assert_all_free(eng)
