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


def test_bars_write_to_stdout_in_a_jupyter_kernel(monkeypatch, capsys):
    """JupyterLab shows a kernel's stderr as an error box: there the bars go to stdout; in a
    terminal they stay on stderr."""
    import sys
    import types

    from mtplab.progress import in_kernel, tqdm

    def bar_output():
        bar = TokenProgress(n_tokens_target=4, n_requests=1)
        bar.update(4, 1)
        bar.close()
        with tqdm(total=2, desc="bench x (local)") as t:
            t.update(2)
        return capsys.readouterr()

    got = bar_output()
    assert not in_kernel() and "bench x" in got.err and got.out == ""
    ZMQInteractiveShell = type("ZMQInteractiveShell", (), {})
    shell = ZMQInteractiveShell()
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    got = bar_output()
    assert in_kernel() and "bench x" in got.out and "generate:" in got.out and got.err == ""


def test_notebook_tables_show_every_column(tmp_path):
    import pandas as pd

    from mtplab.studies.figures import notebook_out
    with pd.option_context("display.max_columns", 20, "display.width", 80):
        notebook_out(tmp_path / "nb")
        wide = pd.DataFrame([range(40)], columns=[f"column_{i}" for i in range(40)])
        assert "..." not in repr(wide) and "column_39" in wide.to_html()
        assert "..." not in wide.to_html()
