"""Progress bars: text bars (tqdm.std) in terminals and notebooks alike.

A text bar redraws in place in Jupyter (carriage returns in the stream output), and an
executed notebook (papermill) keeps its last state. A widget bar (tqdm.auto in a kernel) is
saved as its first frame ("0/6") because executed notebooks store no widget state. In a
Jupyter kernel the bars write to stdout (a plain output; JupyterLab shows stderr as an error
box), in a terminal to stderr as tqdm does.

    bar = TokenProgress(n_tokens_target=8 * 32, n_requests=8)
    bar.update(tokens_done=40, requests_done=1)     # absolute counts, any order of calls
    bar.close()
"""
from __future__ import annotations

import sys

from tqdm.std import tqdm as _tqdm

__all__ = ["TokenProgress", "tqdm"]


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") \
        else None
    return type(shell).__name__ == "ZMQInteractiveShell"


class tqdm(_tqdm):
    """tqdm's text bar, on stdout in a Jupyter kernel (module doc), unless `file` is given."""

    def __init__(self, *args, **kwargs):
        if kwargs.get("file") is None and in_kernel():
            kwargs["file"] = sys.stdout
        super().__init__(*args, **kwargs)


class TokenProgress:
    """Generated tokens against the target (prompts x max_new_tokens), finished requests in
    the postfix. Requests that stop early (EOS, stop ids) leave the bar short of its total."""

    def __init__(self, n_tokens_target: int, n_requests: int, *, enabled: bool = True,
                 desc: str = "generate"):
        self.n_requests = n_requests
        self.requests_done = -1
        self.bar = tqdm(total=n_tokens_target, unit="tok", desc=desc, disable=not enabled,
                        leave=False, dynamic_ncols=True)
        self.update(0, 0)

    def update(self, tokens_done: int, requests_done: int) -> None:
        """Move the bar to `tokens_done` tokens; refresh the postfix when requests finish."""
        if requests_done != self.requests_done:
            self.requests_done = requests_done
            self.bar.set_postfix_str(f"requests {requests_done}/{self.n_requests}", refresh=False)
        self.bar.update(tokens_done - self.bar.n)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> "TokenProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
