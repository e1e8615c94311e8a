"""The batch-aware speculation schedule (`RunConfig.spec_schedule`): which draft setting each
decode batch size runs, as SGLang's batch-size-aware step count and vLLM's
num_speculative_tokens_per_batch_size do.

    {bs_upper: (num_steps, topk) | "off", ...}     e.g. {4: (3, 1), 16: (2, 1), 32: "off"}

    bucket        batch sizes     setting
    4             1 .. 4          3 draft steps, topk 1
    16            5 .. 16         2 draft steps, topk 1
    32            17 .. 32        off: target-only decode steps (the draft only keeps its
                                  inputs current, speculative/worker.py)

Forms the knob takes (all normalised to one sorted dict {int: (S, K) | "off"}):
    a mapping          {4: (3, 1), 32: "off"} (YAML `off`/`false` reads as "off"; keys may
                       be digit strings, values lists: a manifest read back)
    compact text       "4:3x1,16:2x1,32:off"  (the command line)
    a YAML file        path ending .yaml/.yml: the mapping, or a document whose
                       `spec_schedule` key holds it (what `mtplab bench --groups schedule`
                       emits, with the model, device and commit beside it)
Buckets are listed in increasing bs_upper, each once; the last one is max_running_requests
(every batch size has a setting). This module is a leaf (no torch): config validation and the
bench read it.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Union

import yaml

from .errors import ConfigError
from .yamlfile import load_yaml, read_yaml

OFF = "off"
Setting = Union[tuple, str]          # (num_steps, topk) or OFF
Schedule = dict                      # {bs_upper: Setting}, sorted by bs_upper
EXAMPLE = "{4: (3, 1), 16: (2, 1), 32: 'off'} or '4:3x1,16:2x1,32:off'"


def _fail(what: str) -> ConfigError:
    return ConfigError(f"spec_schedule: {what}; write it as {EXAMPLE} (bs_upper: (num_steps, "
                       "topk) or off, in increasing bs_upper).")


def _setting(key, v) -> Setting:
    given = v
    if v is False or (isinstance(v, str) and v.strip().lower() == OFF):
        return OFF
    if isinstance(v, str):
        s, x, k = v.strip().lower().partition("x")
        v = (s, k) if x else (s,)
    if not isinstance(v, (tuple, list)) or len(v) != 2:
        raise _fail(f"bucket {key} has {given!r}, not (num_steps, topk) or off")
    try:
        S, K = (int(str(t).strip()) for t in v)
    except ValueError:
        raise _fail(f"bucket {key} has {given!r}, not two whole numbers") from None
    if S < 1 or K < 1:
        raise _fail(f"bucket {key} has num_steps={S}, topk={K}; both must be >= 1 (use off "
                    "for no speculation)")
    return (S, K)


def _pairs(value) -> list[tuple]:
    """The (key, value) pairs as written, in order."""
    if isinstance(value, dict):
        return list(value.items())
    text = value.strip()
    if text.endswith((".yaml", ".yml")):
        return _pairs(load_file(text))
    if text.startswith("{"):
        doc = load_yaml(text, f"spec_schedule {text!r}")
        if not isinstance(doc, dict):
            raise _fail(f"{text!r} is not a mapping")
        return list(doc.items())
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        k, colon, v = item.partition(":")
        if not colon:
            raise _fail(f"{item!r} has no ':'")
        out.append((k.strip(), v))
    return out


def load_file(path: Union[str, Path]) -> dict:
    """The mapping of a schedule file (the file's `spec_schedule` key, or the file)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"spec_schedule: no file {str(p)!r}; give the YAML file that "
                          "`mtplab bench --groups schedule` wrote, or an inline mapping.")
    doc = read_yaml(p, f"spec_schedule file {p}")
    if isinstance(doc, dict) and "spec_schedule" in doc:
        doc = doc["spec_schedule"]
    if not isinstance(doc, dict) or not doc:
        raise ConfigError(f"spec_schedule: {p} holds no mapping {{bs_upper: (num_steps, topk) "
                          "| off}} (at the top or under `spec_schedule`).")
    return doc


def parse(value) -> Schedule:
    """Any form of the knob -> {bs_upper: (S, K) | "off"}, sorted; ConfigError naming the
    bucket for a bad key or setting, a repeated or unsorted bucket."""
    if not isinstance(value, (dict, str)):
        raise _fail(f"{value!r} is neither a mapping nor text")
    out: Schedule = {}
    for k, v in _pairs(value):
        try:
            key = int(str(k).strip())
        except ValueError:
            raise _fail(f"bucket {k!r} is not a batch size") from None
        if key < 1:
            raise _fail(f"bucket {key} is not a batch size >= 1")
        if key in out:
            raise _fail(f"bucket {key} is given twice (buckets may not overlap)")
        if out and key < max(out):
            raise _fail(f"bucket {key} comes after bucket {max(out)} (unsorted)")
        out[key] = _setting(key, v)
    if not out:
        raise _fail("it names no bucket")
    return out


def check(sched: Schedule, *, num_steps: int, topk: int, max_running_requests: int) -> None:
    """The buckets against the run: every setting within the run's num_steps and topk (what
    the KV reserve, the future map and the simulated rates are sized for), every bucket within
    max_running_requests and the last one equal to it."""
    for b, s in sched.items():
        if b > max_running_requests:
            raise ConfigError(f"spec_schedule bucket {b} lies above max_running_requests="
                              f"{max_running_requests} (a batch never gets that large); lower "
                              f"the bucket to {max_running_requests} or raise "
                              "max_running_requests.")
        if s == OFF:
            continue
        S, K = s
        if S > num_steps or K > topk:
            raise ConfigError(
                f"spec_schedule bucket {b} asks num_steps={S}, topk={K}, beyond the run's "
                f"num_steps={num_steps}, topk={topk} (they bound every bucket: the KV reserve, "
                f"the future map and the simulated rates are sized for them); set "
                f"num_steps={max(S, num_steps)} and topk={max(K, topk)}.")
    last = max(sched)
    if last != max_running_requests:
        raise ConfigError(f"spec_schedule ends at bucket {last} and batches reach "
                          f"max_running_requests={max_running_requests}; end it with a bucket "
                          f"{max_running_requests}: ... (or set max_running_requests={last}).")


def settings(sched: Schedule) -> list[tuple[int, int]]:
    """The distinct settings as (num_steps, topk), off as (0, 1), in bucket order."""
    return list(dict.fromkeys(as_steps(s) for s in sched.values()))


def as_steps(s: Setting) -> tuple[int, int]:
    """(num_steps, topk); off is (0, 1): a decode step with no draft steps."""
    return (0, 1) if s == OFF else tuple(s)


def ranges(sched: Schedule) -> list[tuple[int, int, tuple[int, int]]]:
    """[(lo, hi, (S, K))]: batch sizes lo < bs <= hi run setting (S, K)."""
    lo, out = 0, []
    for hi, s in sched.items():
        out.append((lo, hi, as_steps(s)))
        lo = hi
    return out


def text(sched: Schedule) -> str:
    """The compact form: '4:3x1,16:2x1,32:off'."""
    return ",".join(f"{b}:{OFF if s == OFF else f'{s[0]}x{s[1]}'}" for b, s in sched.items())


def to_yaml(sched: Schedule, meta: dict) -> str:
    """A schedule file: `meta` (model, device, commit, how it was measured) as comments and
    keys, and the `spec_schedule` mapping the knob loads."""
    body = {"spec_schedule": {b: (OFF if s == OFF else list(s)) for b, s in sched.items()}}
    head = "".join(f"# {k}: {v}\n" for k, v in meta.items())
    return head + yaml.safe_dump(body, sort_keys=False, default_flow_style=None)


def geometric_rate(mean_accept_len: float, num_steps: int) -> float:
    """The per-position acceptance r with 1 + r + ... + r^S = mean_accept_len (S = num_steps):
    a simulated mean accept length at the run's num_steps, as one rate every bucket's draft
    positions share (a bucket of fewer steps accepts fewer tokens, as a real draft would)."""
    L, S = mean_accept_len, num_steps
    if L >= S + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):                      # the sum is increasing in r on [0, 1]
        r = (lo + hi) / 2
        if sum(r ** i for i in range(S + 1)) < L:
            lo = r
        else:
            hi = r
    return lo if math.isfinite(lo) else 0.0
