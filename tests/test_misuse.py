"""Misuse from Python gets one sentence (ConfigError) before any work: a run folder or a
save_target folder that cannot be written, a RunConfig changed after construction, a draft a
trained preset does not ship."""
from __future__ import annotations

import pytest

from mtplab import ConfigError, Engine, RunConfig

# (path with {file} = an existing file, {tmp} = tmp_path; the message's words)
BAD_FOLDERS = [
    ("", "is ''; pass a folder path"),
    ("{file}", "{file} is a file, not a folder"),
    ("{file}/under", "{file} is a file, not a folder"),
    ("/proc/nope", "nothing can be written in /proc"),
    ("/sys/nope/x", "nothing can be written in /sys"),
    ("{tmp}/" + "a" * 300, "has 300 bytes and this file system allows"),
]


@pytest.fixture(scope="module")
def engine():
    eng = Engine(RunConfig(model="random-tiny"))
    yield eng
    eng.check_invariants()
    eng.close()


def _fill(tmp_path, path: str, message: str) -> tuple[str, str]:
    afile = tmp_path / "afile"
    afile.write_text("x")
    fill = dict(file=str(afile), tmp=str(tmp_path))
    return path.format(**fill), message.format(**fill)


@pytest.mark.parametrize("path,message", BAD_FOLDERS, ids=[m[:24] for _, m in BAD_FOLDERS])
def test_save_target_refuses_a_folder_it_cannot_write(engine, tmp_path, path, message):
    path, message = _fill(tmp_path, path, message)
    with pytest.raises(ConfigError, match="save_target's folder") as e:
        engine.save_target(path)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_save_target_returns_its_folder(engine, tmp_path):
    out = engine.save_target(tmp_path / "m")
    assert out == tmp_path / "m" and (out / "model.safetensors").is_file()


@pytest.mark.parametrize("path,message", BAD_FOLDERS[1:], ids=[m[:24] for _, m in BAD_FOLDERS[1:]])
def test_a_run_folder_is_checked_before_the_engine_is_built(tmp_path, path, message):
    path, message = _fill(tmp_path, path, message)
    with pytest.raises(ConfigError, match=r"the run folder \(trace_dir/run_name\)") as e:
        Engine(RunConfig(model="random-tiny", event_timeline=True, trace_dir=path))
    assert message in str(e.value)


@pytest.mark.parametrize("change,message", [
    (dict(draft="bogus"), "draft='bogus' is unknown"),
    (dict(topk=0), "topk must be a positive integer, got 0"),
    (dict(page_size=3), "page_size=3 is not a power of two"),
    (dict(max_running_requests="8"), "max_running_requests is an integer but got the string"),
    (dict(run_name="a/b"), "run_name='a/b' must be a plain folder name"),
    (dict(draft="gemma4_assistant", model="tiny-code"), "ships no 'gemma4_assistant' draft"),
], ids=lambda v: str(v)[:30])
def test_a_config_changed_after_construction_is_checked_again_by_the_engine(change, message):
    cfg = RunConfig(model="random-tiny", draft="eagle")
    for k, v in change.items():
        setattr(cfg, k, v)
    with pytest.raises(ConfigError, match=message):
        Engine(cfg)


def test_a_draft_the_trained_preset_does_not_ship_is_refused_by_runconfig():
    with pytest.raises(ConfigError, match=r"ships no 'gemma4_assistant' draft.*pick a draft it "
                                          r"ships \(\['frozen_kv_mtp', 'eagle'\]\)"):
        RunConfig(model="tiny-code", draft="gemma4_assistant")
