"""Corrupt or mismatched model folders: one line "<path>: <problem>; <fix>", never a
traceback, from load_model, from RunConfig/Engine, and from `mtplab run` (exit 2)."""
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from mtplab import Engine, ModelLoadError, RunConfig
from mtplab.cli import main
from mtplab.models.llama import LlamaForCausalLM
from mtplab.models.llama_config import LlamaConfig
from mtplab.models.weights import load_model, save_model
from mtplab.models.zoo import init_random

TINY = dict(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16,
            max_position_embeddings=256)


@pytest.fixture
def model_dir(tmp_path):
    m = LlamaForCausalLM(LlamaConfig(**TINY))
    init_random(m, 0)
    save_model(m, tmp_path / "m")
    return tmp_path / "m"


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def _edit_weights(d, fn):
    sd = load_file(str(d / "model.safetensors"))
    fn(sd)
    save_file(sd, str(d / "model.safetensors"))


def _poison(name, value):
    def fn(sd):
        sd[name] = sd[name].clone()
        sd[name].view(-1)[3] = value
    return fn


def _write(path, data: bytes):
    path.write_bytes(data)


CASES = [  # (id, corrupt(d), file the message names, problem the message states)
    ("truncated", lambda d: _write(d / "model.safetensors",
                                   (d / "model.safetensors").read_bytes()[:5000]),
     "model.safetensors", "not a readable safetensors file .*truncated or corrupt"),
    ("truncated-tail", lambda d: _write(d / "model.safetensors",
                                        (d / "model.safetensors").read_bytes()[:-8]),
     "model.safetensors", "not a readable safetensors file"),
    ("empty", lambda d: _write(d / "model.safetensors", b""),
     "model.safetensors", "empty file"),
    ("garbage", lambda d: _write(d / "model.safetensors", b"\x00garbage" * 100),
     "model.safetensors", "not a readable safetensors file"),
    ("no-weights", lambda d: (d / "model.safetensors").unlink(),
     "m", r"no \*.safetensors weights file"),
    ("missing-tensor", lambda d: _edit_weights(
        d, lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight")),
     "m", "weights missing for model.layers.1.mlp.up_proj.weight"),
    ("more-layers-in-config", lambda d: _edit_config(d, num_hidden_layers=3),
     "m", r"weights missing for model.layers.2.input_layernorm.weight \(\+8 more\)"),
    ("fewer-layers-in-config", lambda d: _edit_config(d, num_hidden_layers=1),
     "model.safetensors", r"unexpected tensor model.layers.1.input_layernorm.weight \(\+8 more\)"),
    ("shape-mismatch", lambda d: _edit_config(d, intermediate_size=48),
     "model.safetensors",
     r"model.layers.0.mlp.down_proj.weight has shape \[32, 64\] "
     r"but config.json implies \[32, 48\]"),
    ("heads-mismatch", lambda d: _edit_config(d, num_key_value_heads=2),
     "model.safetensors", r"k_proj.weight has shape \[16, 32\] but config.json implies \[32, 32\]"),
    ("nan", lambda d: _edit_weights(d, _poison("model.layers.0.self_attn.q_proj.weight", math.nan)),
     "model.safetensors", "model.layers.0.self_attn.q_proj.weight holds 1 NaN/Inf values"),
    ("inf", lambda d: _edit_weights(d, _poison("model.norm.weight", math.inf)),
     "model.safetensors", "model.norm.weight holds 1 NaN/Inf values"),
    ("int-weights", lambda d: _edit_weights(
        d, lambda sd: sd.update({"model.norm.weight": torch.ones(32, dtype=torch.int32)})),
     "model.safetensors", "model.norm.weight has dtype torch.int32; weights must be floating"),
    ("config-missing-key", lambda d: _edit_config(d, hidden_size=None),
     "config.json", r"missing required keys \['hidden_size'\]; a Llama config.json needs"),
    ("config-bad-value", lambda d: _edit_config(d, num_attention_heads="2"),
     "config.json", "num_attention_heads='2' is not a positive integer"),
    ("config-zero", lambda d: _edit_config(d, vocab_size=0),
     "config.json", "vocab_size=0 is not a positive integer"),
    ("config-invalid-json", lambda d: _write(d / "config.json", b'{"vocab_size": 64,'),
     "config.json", "not valid JSON"),
    ("config-not-object", lambda d: _write(d / "config.json", b"[1, 2]"),
     "config.json", "holds a JSON list, not an object"),
    ("config-gqa", lambda d: _edit_config(d, num_key_value_heads=3),
     "config.json", "num_attention_heads must be a multiple of num_key_value_heads"),
]


def _expect(exc, d, fname, problem):
    msg = str(exc)
    assert "\n" not in msg, msg
    path = d if fname == "m" else d / fname
    assert msg.startswith(f"{path}: "), msg
    assert __import__("re").search(problem, msg), msg


@pytest.mark.parametrize("corrupt,fname,problem", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_corrupt_model_folder(model_dir, corrupt, fname, problem):
    corrupt(model_dir)
    with pytest.raises(ModelLoadError) as e:
        load_model(model_dir)
    _expect(e.value, model_dir, fname, problem)
    with pytest.raises(ModelLoadError) as e:        # the user's path: config, then engine
        Engine(RunConfig(model=str(model_dir), context_len=64, device="cpu"))
    _expect(e.value, model_dir, fname, problem)


def test_no_config_json(model_dir):
    (model_dir / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=f"{model_dir / 'config.json'}: not found"):
        load_model(model_dir)


def test_a_good_folder_loads_and_round_trips(model_dir):
    eng = Engine(RunConfig(model=str(model_dir), context_len=64, device="cpu"))
    ref = LlamaForCausalLM(LlamaConfig(**TINY))
    init_random(ref, 0)
    got = eng.model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in ref.state_dict().items())
    eng.generate([[5, 6, 7]], max_new_tokens=3)
    eng.check_invariants()


@pytest.mark.parametrize("case", ["truncated", "config-missing-key"])
def test_cli_prints_one_line_and_exits_2(model_dir, capsys, case):
    dict((c[0], c[1]) for c in CASES)[case](model_dir)
    rc = main(["run", "--model", str(model_dir), "--prompts", "1", "--max-new-tokens", "2",
               "--min-prompt-len", "2", "--max-prompt-len", "3", "--context-len", "64",
               "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and str(model_dir) in err, err
    assert "Traceback" not in err
