"""The run progress bar counts generated tokens, finished requests in the postfix."""
from __future__ import annotations

import io

from mtplab import Engine, RunConfig, engine as engine_mod
from mtplab.progress import TokenProgress


def test_token_progress_counts_tokens_and_shows_requests():
    bar = TokenProgress(n_tokens_target=32, n_requests=4)
    bar.bar.fp = io.StringIO()
    assert bar.bar.total == 32 and bar.bar.n == 0 and "requests 0/4" in bar.bar.postfix
    bar.update(10, 0)
    bar.update(24, 2)
    assert bar.bar.n == 24 and bar.bar.unit == "tok" and "requests 2/4" in bar.bar.postfix
    bar.close()


def test_generate_drives_the_bar_with_tokens(monkeypatch):
    calls = []

    class Recording(TokenProgress):
        def __init__(self, n_tokens_target, n_requests, **kw):
            calls.append(("init", n_tokens_target, n_requests, kw.get("enabled")))
            super().__init__(n_tokens_target, n_requests, **kw)

        def update(self, tokens_done, requests_done):
            calls.append((tokens_done, requests_done))
            super().update(tokens_done, requests_done)

    monkeypatch.setattr(engine_mod, "TokenProgress", Recording)
    eng = Engine(RunConfig(model="random-tiny", device="cpu", context_len=64,
                           max_running_requests=2))
    eng.generate([[5, 6, 7], [8, 9]], max_new_tokens=5, ignore_eos=True, progress=True)
    eng.check_invariants()
    assert calls[0] == ("init", 10, 2, True)
    steps = calls[2:]                       # [1] is the constructor's update(0, 0)
    assert steps[-1] == (10, 2)             # every token, both requests
    assert [t for t, _ in steps] == sorted(t for t, _ in steps) and steps[0][0] < 10
