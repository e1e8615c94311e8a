"""The CLI end to end (subprocess, like a user)."""
import subprocess
import sys


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "mtplab.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_run_prints_results_table():
    r = run("run", "--model", "random-tiny", "--page-size", "16", "--prompts", "4",
            "--max-new-tokens", "8", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "tok_per_s" in r.stdout and "decode_steps" in r.stdout
    assert "page_size=16" in r.stdout


def test_demo_runs_on_cpu_and_writes_the_run_folder(tmp_path):
    r = run("demo", "--device", "cpu", "--max-new-tokens", "8", "--trace-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "mtplab demo on cpu" in r.stdout and "model tiny-code" in r.stdout
    (run_dir,) = tmp_path.iterdir()
    names = {p.name for p in run_dir.iterdir()}
    assert {"manifest.json", "steps.parquet", "gaps.parquet", "timeline.png",
            "timeline.parquet"} <= names
    assert any(n.endswith(".pt.trace.json.gz") for n in names)


def test_bad_flag_value_is_one_clear_error():
    r = run("run", "--page-size", "3", "--device", "cpu")
    assert r.returncode == 2
    assert "not a power of two" in r.stderr and "Traceback" not in r.stderr
