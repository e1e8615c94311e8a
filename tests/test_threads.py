"""One Engine shared between threads returns, to each caller, the tokens it would get alone:
for every draft kind and both loops, through `generate` and through interleaved `step()`
calls (engine.py, "Threads")."""
import sys
import threading

import pytest

from mtplab import Engine, RunConfig
from mtplab.draft_kinds import DRAFT_CHOICES

THREADS = 4
MAX_NEW = 12


@pytest.fixture
def busy_switching():
    """Switch threads every few microseconds, so that unserialised calls interleave inside a
    step rather than only between them."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _prompts(k: int) -> list[list[int]]:
    return [[5 + k, 6 + k, 7 + k], [9 + k, 3, 4 + k, 8]]


def _run_threads(target, n: int) -> list:
    """target(k) in n threads released together; returns their results, raises the first
    error."""
    start = threading.Barrier(n)
    results, errors = [None] * n, []

    def run(k):
        start.wait()
        try:
            results[k] = target(k)
        except BaseException as e:        # re-raised on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
@pytest.mark.parametrize("draft", DRAFT_CHOICES)
def test_threads_share_one_engine(draft, overlap, busy_switching):
    eng = Engine(RunConfig(model="random-tiny", draft=draft, overlap=overlap))
    alone = [eng.generate(_prompts(k), max_new_tokens=MAX_NEW, ignore_eos=True)
             for k in range(THREADS)]

    # generate from every thread at once
    got = _run_threads(lambda k: eng.generate(_prompts(k), max_new_tokens=MAX_NEW,
                                              ignore_eos=True), THREADS)
    assert got == alone
    eng.check_invariants()

    # the step API: each thread adds its requests and steps until they are finished
    def by_steps(k):
        reqs = [eng.add_request(p, MAX_NEW, ignore_eos=True) for p in _prompts(k)]
        while not all(r.finished for r in reqs):
            eng.step()
        return [r.output_ids for r in reqs]

    assert _run_threads(by_steps, THREADS) == alone
    assert eng.idle
    eng.check_invariants()
    eng.close()
