"""`mtplab bench --smoke`: every arm for a few steps on CPU, in the table format."""
import subprocess
import sys

from mtplab.bench import GROUPS, arms


def test_arm_set_covers_the_standard_comparisons():
    full = arms(smoke=False)
    groups = {a.group for a in full}
    assert groups == set(GROUPS)
    names = {(a.group, a.name) for a in full}
    assert {("drafts", "target-only"), ("drafts", "frozen_kv_mtp"), ("drafts", "eagle"),
            ("overlap", "none off"), ("overlap", "frozen_kv_mtp on+zb"),
            ("fold_seed", "fold_seed=True"), ("page_topk", "P=64 K=4")} <= names
    assert {a.bs for a in full if a.group == "drafts"} == {1, 8, 32}


def test_bench_smoke_runs_every_arm_and_prints_the_table(tmp_path):
    out = tmp_path / "bench.md"
    r = subprocess.run([sys.executable, "-m", "mtplab.cli", "bench", "--smoke", "--device", "cpu",
                        "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    for g in GROUPS:
        assert f"### {g}" in text
    assert "failed" not in text
    n_rows = sum(1 for ln in text.splitlines() if ln.startswith("| ") and "arm |" not in ln)
    assert n_rows == len(arms(smoke=True))
    assert (tmp_path / "bench.json").exists()
