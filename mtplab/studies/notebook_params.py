"""The notebooks' parameters, checked in the cell right after the parameters cell:

    check_params(globals())

Every parameter a notebook declares has one row in PARAMS (its type, and what else a value
must satisfy); a wrong type, a value out of range or an unknown model is one ConfigError
naming the parameter, before anything runs, instead of a traceback cells later (or, for a
model, a sweep of dropped cells that ends without an error).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..draft_kinds import DRAFT_CHOICES
from ..errors import ConfigError, ModelLoadError
from ..validate import check_device, check_value


def _known_model(name: str, value: str) -> None:
    from ..models.zoo import model_config
    try:
        model_config(value)
    except (ValueError, OSError, ModelLoadError) as e:
        raise ConfigError(f"{name}: {str(e).rstrip('.')}.") from None


def _positive(name: str, value) -> None:
    if isinstance(value, float) and not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive finite number, got {value!r}.")


def _at_least(lo: int) -> Callable[[str, Any], None]:
    def check(name: str, value) -> None:
        if value < lo:
            raise ConfigError(f"{name} must be at least {lo}, got {value!r}.")
    return check


def _one_of(*choices) -> Callable[[str, Any], None]:
    def check(name: str, value) -> None:
        if value not in choices:
            raise ConfigError(f"{name}={value!r} is not one of {list(choices)}.")
    return check


def _rungs(name: str, value: list) -> None:
    for i, rung in enumerate(value):
        if not (isinstance(rung, (list, tuple)) and len(rung) == 2):
            raise ConfigError(f"{name}[{i}]={rung!r} is not a (model, batch size) pair, e.g. "
                              "['random-tiny', 4].")
        check_value(f"{name}[{i}] model", rung[0], str)
        check_value(f"{name}[{i}] batch size", rung[1], int)
        _at_least(1)(f"{name}[{i}] batch size", rung[1])
        _known_model(f"{name}[{i}] model", rung[0])


@dataclass(frozen=True)
class Param:
    """A notebook parameter: its type (validate.check_value); for a list, its items' type (a
    list is never empty); `check` run on the value, or on every item of a list; `whole` on
    the value as a whole."""
    type: Any
    check: Optional[Callable[[str, Any], None]] = None
    item: Any = None
    whole: Optional[Callable[[str, Any], None]] = None


def _path(name: str, value: str) -> None:
    if not value.strip():
        raise ConfigError(f"{name} is empty; give a path.")


_COUNT = Param(int, _at_least(1))
_COUNTS = Param(list, _at_least(1), item=int)
PARAMS: dict[str, Param] = {
    "device": Param(str, lambda n, v: check_device(v)),
    "model": Param(str, _known_model),
    "cpu_model": Param(str, _known_model),
    "layers": Param(Optional[int], _at_least(1)),
    "draft": Param(str, _one_of(*DRAFT_CHOICES)),
    "drafts": Param(list, _one_of(*DRAFT_CHOICES), item=str),
    "simulate_accept_len": Param(Optional[float], _at_least(1)),
    "prompts": Param(str, _one_of("random", "code")),
    "prompt_len_tokens": _COUNT, "output_len_tokens": _COUNT, "cpu_output_len_tokens": _COUNT,
    "batch_size": _COUNT, "num_steps": _COUNT, "topk": _COUNT, "page_size": _COUNT,
    "repeats": _COUNT,
    "batch_sizes": _COUNTS, "cpu_batch_sizes": _COUNTS, "page_sizes": _COUNTS, "topks": _COUNTS,
    "contexts": _COUNTS, "cpu_contexts": _COUNTS, "acceptance_contexts": _COUNTS,
    "cpu_acceptance_contexts": _COUNTS,
    "cuda_graphs": Param(Optional[list], item=bool),
    "cpu_rungs": Param(list, whole=_rungs),
    "ladder": Param(str, _one_of("quick", "full")),
    "only": Param(dict),
    "budget_s": Param(Optional[float], _positive),
    "cell_timeout_s": Param(float, _positive),
    "resume": Param(bool),
    "out_dir": Param(str, _path),
    "results_path": Param(Optional[str], _path),
    "trace_path": Param(Optional[str], _path),
    "skip_steps": Param(Optional[int], _at_least(0)),
    "min_gap_us": Param(float, _at_least(0)),
}


def check_param(name: str, value: Any) -> Any:
    """One parameter against its PARAMS row; returns it normalised (check_value's)."""
    p = PARAMS[name]
    if p.type in (list, Optional[list]) and not isinstance(value, list) \
            and not (value is None and p.type is not list):
        raise ConfigError(f"{name} must be a list such as [1, 4], got {value!r} "
                          f"({type(value).__name__}).")
    value = check_value(name, value, p.type)
    if value is None:
        return None
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{name} is empty; give at least one value.")
        for i, v in enumerate(value):
            if p.item is not None:
                check_value(f"{name}[{i}]", v, p.item)
            if p.check is not None:
                p.check(f"{name}[{i}]", v)
    elif p.check is not None:
        p.check(name, value)
    if p.whole is not None:
        p.whole(name, value)
    return value


def check_params(namespace: dict[str, Any]) -> None:
    """Every notebook parameter found in `namespace` (a notebook's globals()) checked against
    PARAMS; ConfigError naming the first bad one."""
    for name in PARAMS:
        if name in namespace:
            check_param(name, namespace[name])
