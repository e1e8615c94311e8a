"""A native-API driver for a running SGLang server: health, /generate with token ids
(streamed, for TTFT / ITL), /start_profile and /stop_profile. Standard library only.

Per request (stream=True, SSE `data: {...}` chunks, `data: [DONE]` last):
    ttft = first chunk - send;  itl = chunk-to-chunk times divided by the tokens each adds,
    from the first decode step's chunk on (the gap from the prefill's chunk to it is left out,
    as mtplab's Engine.stats does; SGLang's bench_serving counts it);
    meta_info of the last chunk: completion_tokens, spec_verify_ct, spec_accept_length.
Run metrics: tok/s = completion tokens / wall; tpot = (e2e - ttft) / (tokens - 1), mean over
requests; itl_p50/p99 over all token gaps; accept_len = tokens / verify steps (spec runs).
"""
from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np


class ServerError(RuntimeError):
    """The server did not answer as SGLang does; the message says which endpoint."""


@dataclass
class RequestStats:
    tokens: int
    e2e_s: float
    ttft_s: float
    itl_s: list = field(default_factory=list)
    verify_ct: Optional[int] = None
    output_ids: list = field(default_factory=list)


def _post(url: str, payload: dict, timeout: float):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def check_port_free(host: str, port: int) -> None:
    """Refuse a port something already listens on: a server answering there would be measured
    in place of the one about to start (which could not bind it and would exit)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as so:
        so.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)    # as the server binds
        try:
            so.bind((host, port))
        except OSError as e:
            raise ServerError(f"port {port} on {host} is already in use ({e.strerror}); stop "
                              "what listens there or pass another port.") from None


def wait_healthy(base_url: str, timeout_s: float = 600.0, poll_s: float = 1.0,
                 alive=lambda: True) -> None:
    """Poll GET /health until 200 from a live server: `alive()` False (the server process
    died) stops early, and after the 200 too (then another process answered). Until the
    server listens, a poll may be refused, time out, or read a malformed answer (a
    connection to a loopback port nothing listens on can connect to itself and read back
    its own request): each is "not yet"."""
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if not alive():
            raise ServerError(f"the server process exited before {base_url}/health answered.")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=poll_s + 1) as r:
                if r.status == 200:
                    if not alive():
                        raise ServerError(f"the server process exited; what answered "
                                          f"{base_url}/health is another process.")
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError,
                http.client.HTTPException):
            pass
        time.sleep(poll_s)
    raise ServerError(f"{base_url}/health did not answer within {timeout_s:.0f} s.")


def generate_one(base_url: str, input_ids: Sequence[int], max_new_tokens: int,
                 timeout_s: float = 600.0) -> RequestStats:
    payload = {"input_ids": list(map(int, input_ids)), "stream": True,
               "sampling_params": {"max_new_tokens": int(max_new_tokens), "temperature": 0.0,
                                   "ignore_eos": True}}
    t0 = time.perf_counter()
    times, counts, meta, out = [], [], {}, []
    try:
        with _post(f"{base_url}/generate", payload, timeout_s) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                body = line[5:].strip()
                if body == "[DONE]":
                    break
                meta, out = _chunk(json.loads(body), base_url, meta, out)
                times.append(time.perf_counter())
                counts.append(meta["completion_tokens"])
    except (OSError, http.client.HTTPException, ValueError) as e:   # URLError is an OSError
        raise ServerError(f"{base_url}/generate failed: {type(e).__name__}: {e}") from None
    if not times:
        raise ServerError(f"{base_url}/generate streamed no chunk.")
    return RequestStats(tokens=counts[-1], e2e_s=times[-1] - t0, ttft_s=times[0] - t0,
                        itl_s=chunk_itl(times, counts),
                        verify_ct=meta.get("spec_verify_ct"), output_ids=list(out))


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _chunk(chunk, base_url: str, meta: dict, out: list) -> tuple[dict, list]:
    """(meta_info, output_ids) of one streamed /generate chunk, checked against SGLang's shape:
    an object; meta_info an object with completion_tokens and spec_verify_ct counts (a count
    absent: the previous chunk's, 0 at first); output_ids a list of token ids (absent: the
    previous chunk's). Anything else is one ServerError sentence naming what was wrong."""
    def bad(what: str) -> ServerError:
        return ServerError(f"{base_url}/generate streamed a chunk that is not SGLang's: "
                           f"{what}; is an SGLang server listening there?")

    if not isinstance(chunk, dict):
        kind = "null" if chunk is None else type(chunk).__name__
        raise bad(f"a JSON {kind} where an object belongs ({str(chunk)[:60]})")
    m = chunk.get("meta_info", {})
    if not isinstance(m, dict):
        raise bad(f"meta_info is {m!r}, not an object")
    meta = {"completion_tokens": m.get("completion_tokens", meta.get("completion_tokens", 0)),
            "spec_verify_ct": m.get("spec_verify_ct", meta.get("spec_verify_ct"))}
    for key, v in meta.items():
        if not (_is_count(v) or (v is None and key == "spec_verify_ct")):
            raise bad(f"meta_info.{key} is {v!r}, not a count")
    ids = chunk.get("output_ids", out)
    if not isinstance(ids, list) or not all(_is_count(t) for t in ids):
        raise bad(f"output_ids is {str(ids)[:60]}, not a list of token ids")
    return meta, ids


def chunk_itl(times: Sequence[float], counts: Sequence[int]) -> list[float]:
    """ITL samples of one request's chunks (arrival times, completion tokens so far): each gap
    divided by the tokens it adds, once per token, from the first decode step's chunk on."""
    return [(b - a) / (n1 - n0)
            for a, b, n0, n1 in zip(times[1:], times[2:], counts[1:], counts[2:])
            if n1 > n0 for _ in range(n1 - n0)]


def run_workload(base_url: str, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 concurrency: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as ex:
        stats = list(ex.map(lambda p: generate_one(base_url, p, max_new_tokens), prompts))
    wall = time.perf_counter() - t0
    tokens = sum(s.tokens for s in stats)
    itl = np.array([x for s in stats for x in s.itl_s]) if any(s.itl_s for s in stats) else None
    tpot = [(s.e2e_s - s.ttft_s) / (s.tokens - 1) for s in stats if s.tokens > 1]
    verify = [s.verify_ct for s in stats if s.verify_ct]
    return {
        "requests": len(stats), "completion_tokens": tokens, "wall_s": wall,
        "tok_per_s": tokens / wall if wall > 0 else float("nan"),
        "ttft_ms": 1e3 * float(np.mean([s.ttft_s for s in stats])),
        "tpot_ms": 1e3 * float(np.mean(tpot)) if tpot else float("nan"),
        "itl_p50_ms": 1e3 * float(np.percentile(itl, 50)) if itl is not None else float("nan"),
        "itl_p99_ms": 1e3 * float(np.percentile(itl, 99)) if itl is not None else float("nan"),
        "accept_len": (sum(s.tokens for s in stats if s.verify_ct) / sum(verify)
                       if verify else float("nan")),
    }


def start_profile(base_url: str, output_dir: str, num_steps: int, profile_id: str) -> None:
    payload = {"output_dir": output_dir, "num_steps": int(num_steps),
               "activities": ["CPU", "GPU"], "profile_id": profile_id}
    with _post(f"{base_url}/start_profile", payload, 60) as r:
        if r.status != 200:
            raise ServerError(f"{base_url}/start_profile answered {r.status}.")


def stop_profile(base_url: str) -> None:
    try:
        with _post(f"{base_url}/stop_profile", {}, 600) as r:
            r.read()
    except urllib.error.HTTPError as e:   # already stopped after num_steps
        if e.code not in (400, 500):
            raise
