"""Validation at the door: every bad RunConfig field and every bad `generate` argument raises
one sentence naming the field, the bad value and the fix, before anything is built or
admitted."""
import math
import subprocess
import sys

import numpy as np
import pytest

from mtplab import ConfigError, Engine, RunConfig

CFG = [  # (kwargs, the message must match)
    (dict(topk=400, num_steps=2, num_draft_tokens=801), "topk=400 is larger than the vocabulary"),
    (dict(context_len=128.0),
     "context_len must be an integer, got 128.0 .float.; write context_len=128"),
    (dict(max_total_tokens=4096.5), "max_total_tokens must be an integer"),
    (dict(num_draft_tokens=4.0), "num_draft_tokens must be an integer"),
    (dict(page_size="16"), "page_size is an integer but got the string '16'; write page_size=16"),
    (dict(simulate_accept_len="2.5", draft="eagle"),
     "simulate_accept_len is a number but got the string '2.5'; write simulate_accept_len=2.5"),
    (dict(max_running_requests=True), "max_running_requests must be an integer, got a boolean"),
    (dict(num_steps=False), "num_steps must be an integer, got a boolean"),
    (dict(overlap="no"), "overlap is a boolean but got the string .no. .*write overlap=False"),
    (dict(overlap="maybe"), "use overlap=True or overlap=False"),
    (dict(profile="true"), "write profile=True without quotes"),
    (dict(cuda_graphs=1), "cuda_graphs must be True or False, got 1"),
    (dict(device="gpu"), "device='gpu' is not a device; use 'auto', 'cpu'"),
    (dict(device=""), "device='' is not a device"),
    (dict(device="cuda:x"), "device='cuda:x' is not a device"),
    (dict(seed=2 ** 70),
     r"seed 1180591620717411303424 is out of range: seeds must lie in \[0, 2\*\*32\)"),
    (dict(seed=-1), r"seed -1 is out of range"),
    (dict(seed=2 ** 32), r"use a seed in \[0, 4294967295\]"),
    (dict(seed=1.5), "seed must be an integer, got 1.5"),
    (dict(seed="7"), "seed is an integer but got the string '7'"),
    (dict(model=123), "model must be a string, got 123 \\(int\\); quote it"),
    (dict(model=""), "model is empty"),
    (dict(model="llama3-8b-like", layers=0), "layers must be a positive integer, got 0"),
    (dict(model="llama3-8b-like@0"), "has 1..32 layers; got 0"),
    (dict(layers=2.0, model="llama3-8b-like"), "layers must be an integer"),
    (dict(draft=None), "draft must be a string, got None"),
    (dict(simulate_accept_rates="0.5,0.5,0.5", draft="eagle"),
     "simulate_accept_rates must be a sequence"),
    (dict(simulate_accept_rates=("0.5", 0.5, 0.5), draft="eagle"), "must hold numbers"),
    (dict(profile_wait=-1), "profile_wait must be at least 0, got -1"),
    (dict(context_len=1), "context_len must be at least 2, got 1"),
    (dict(run_name="/tmp/x"), "run_name='/tmp/x' must be a plain folder name under trace_dir"),
    (dict(run_name="../up"), "must be a plain folder name"),
    (dict(run_name=".."), "must be a plain folder name"),
    (dict(run_name="a/b"), "must be a plain folder name"),
    (dict(run_name="a\\b"), "must be a plain folder name"),
    (dict(run_name=""), "must be a plain folder name"),
    (dict(trace_dir=5), "trace_dir must be a string"),
]


@pytest.mark.parametrize("kw,msg", CFG, ids=[str(k) for k, _ in CFG])
def test_bad_config_field(kw, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        RunConfig(**kw)
    text = str(e.value)
    assert "\n" not in text and text.endswith(".")


def test_types_are_normalised_and_round_trip():
    cfg = RunConfig(seed=np.int64(3), page_size=np.int32(4), draft="eagle",
                    simulate_accept_len=2, simulate_accept_rates=None, context_len=64)
    assert type(cfg.seed) is int and type(cfg.page_size) is int
    assert type(cfg.simulate_accept_len) is float
    assert RunConfig(**{f: getattr(cfg, f) for f in RunConfig.field_names()}) == cfg
    rates = RunConfig(draft="eagle", simulate_accept_rates=[1, 0.5, 0.25])
    assert rates.simulate_accept_rates == (1.0, 0.5, 0.25)
    assert RunConfig(seed=2 ** 32 - 1).seed == 2 ** 32 - 1


def test_every_field_is_type_checked():
    """The generic check covers every annotation RunConfig uses (a new knob needs nothing)."""
    from mtplab.validate import check_fields
    cfg = RunConfig()
    for name in RunConfig.field_names():
        bad = object()
        setattr(cfg, name, bad)
        with pytest.raises(ConfigError, match=name):
            check_fields(cfg)
        setattr(cfg, name, getattr(RunConfig(), name))


@pytest.fixture(scope="module")
def eng():
    return Engine(RunConfig(model="random-tiny", context_len=128, max_running_requests=1))


GEN = [  # (kwargs for generate, the message must match)
    (dict(prompts=[[5, 6, 7]], max_new_tokens=4, temperature=1.0, seed=2 ** 70),
     r"seed 1180591620717411303424 is out of range"),
    (dict(prompts=[[5, 6], [7]], seed=2 ** 32 - 1),
     r"request i uses seed \+ i, for 2 requests\); use a seed in \[0, 4294967294\]"),
    (dict(prompts=[[5]], seed=-3), "seed -3 is out of range"),
    (dict(prompts=[[5]], seed=1.0), "seed must be an integer"),
    (dict(prompts=[[5]], max_new_tokens=4.0), "max_new_tokens must be a positive integer"),
    (dict(prompts=[[5]], max_new_tokens=True), "max_new_tokens must be a positive integer"),
    (dict(prompts=[[5]], max_new_tokens="8"), "max_new_tokens must be a positive integer"),
    (dict(prompts=[[5]], max_new_tokens=0), "max_new_tokens must be a positive integer"),
    (dict(prompts=[[5, 6.0]]), r"prompt 0 holds 6.0 \(float\); token ids are integers"),
    (dict(prompts=[[5, True]]), r"prompt 0 holds True \(bool\)"),
    (dict(prompts=[["5"]]), r"prompt 0 holds '5' \(str\)"),
    (dict(prompts=[[5, 999]]), r"prompt 0 holds token id 999, outside the vocabulary \[0, 320\)"),
    (dict(prompts=[np.array([5.0, 6.0])]), r"prompt 0 holds 5.0 \(float\)"),
    (dict(prompts="def f():"), "wrap a single string in"),
    (dict(prompts=[[5]], temperature=float("nan")), "temperature must be a finite number"),
    (dict(prompts=[[5]], temperature=math.inf), "temperature must be a finite number"),
    (dict(prompts=[[5]], temperature=-0.5), "temperature must be a finite number >= 0"),
    (dict(prompts=[[5]], temperature="0.7"), "temperature must be a finite number"),
    (dict(prompts=[[5]], top_p=float("nan")), r"top_p must be a number in \(0, 1\]"),
    (dict(prompts=[[5]], top_p=0), r"top_p must be a number in \(0, 1\]"),
    (dict(prompts=[[5]], stop_ids="\n"), "stop_ids must be a list of token ids, got str"),
    (dict(prompts=[[5]], stop_ids=[10, 2.5]), r"stop_ids holds 2.5 \(float\)"),
    (dict(prompts=[[5]], stop_ids=[-1]), "stop_ids holds token id -1, outside the vocabulary"),
    (dict(prompts=[[5]], ignore_eos="yes"), "ignore_eos must be True or False"),
]


@pytest.mark.parametrize("kw,msg", GEN, ids=[str(k)[:60] for k, _ in GEN])
def test_bad_generate_argument_is_refused_before_admission(eng, kw, msg):
    before = eng._next_rid
    with pytest.raises(ValueError, match=msg) as e:
        eng.generate(**kw)
    assert "\n" not in str(e.value)
    assert eng._next_rid == before                # no request was made
    assert eng.scheduler.idle
    eng.check_invariants()
    assert eng.allocator.free_pages == eng.allocator.total_pages


def test_generate_accepts_numpy_ints_and_arrays(eng):
    a = eng.generate([[5, 6, 7]], max_new_tokens=np.int64(4), temperature=1.0,
                     seed=np.uint32(9), stop_ids=np.array([1, 2]))
    b = eng.generate([np.array([5, 6, 7])], max_new_tokens=4, temperature=1.0, seed=9,
                     stop_ids=(1, 2))
    c = eng.generate([[5, 6, 7]], max_new_tokens=4, temperature=1.0, seed=9,
                     stop_ids=frozenset({2, 1}))          # a set of stops is a collection too
    assert a == b == c and all(type(t) is int for t in a[0])
    eng.check_invariants()


def test_config_error_importable_without_torch():
    code = ("import sys; from mtplab import ConfigError, ModelLoadError; "
            "assert issubclass(ModelLoadError, ConfigError) and issubclass(ConfigError, "
            "ValueError); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
    from mtplab.config import ConfigError as C1
    from mtplab.core import ConfigError as C2
    assert C1 is C2 is ConfigError
