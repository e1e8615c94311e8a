"""benchmarks/bench_meter.py on CPU (the overhead and host-wake parts), and --pool: saved
overhead runs pooled (no GPU). Planted rates: the meter arm exactly 2% slower than off, the
unstamped arm 0.5% slower, so every column is known."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mtplab.studies.meter_trust.meter_bench import main
from mtplab.studies.meter_trust.meter_overhead import OVERHEAD_ARMS, overhead


def raw(path, reps: int, seed: int, eager: bool = True, per_arm: int = 3,
        arms: tuple = OVERHEAD_ARMS, tokens: int | None = None, offsets: dict | None = None):
    """A planted --raw file; `offsets`: per arm, each engine's own log speed offset."""
    rng = np.random.default_rng(seed)
    machine = 3000 * np.exp(rng.normal(0, 0.05, reps))        # shared by every engine
    slow = {"off": 1.0, "on": 0.98, "unstamped": 0.995}
    z = {} if tokens is None else {"bs1 tokens": np.array(tokens)}
    for a in arms:
        for i in range(per_arm):
            rate = machine * slow[a] * np.exp((offsets or {}).get(a, [0.0] * per_arm)[i])
            z[f"bs1 {a} {i}"] = rate
            z[f"bs1 {a} {i} step_p50_ms"] = 1e3 / rate
    if eager:
        z["bs1 eager_per_step"] = np.array(0.25)
    np.savez(path, **z)
    return path


def cells_of(line: str) -> list[str]:
    return [c.strip() for c in line.strip("|").split("|")]


def row(out: str) -> list[str]:
    return cells_of(next(ln for ln in out.splitlines() if ln.startswith("| 1 |")))


def test_pool_reads_planted_ratios_back(tmp_path, capsys):
    a, b = raw(tmp_path / "a.npz", 50, 0), raw(tmp_path / "b.npz", 40, 1, eager=False)
    assert main(["--pool", str(a), str(b), "--out", str(tmp_path / "p.md")]) == 0
    cells = row(capsys.readouterr().out)
    assert cells[3] == "0.2"                                  # mean of the runs that counted
    assert cells[4].startswith("2.00% [2.00, 2.00]") and cells[5] == "2.00%"
    assert cells[6].startswith("2.00%") and cells[7] == "0.00%, 0.00%"
    assert cells[8] == "2.00% [2.00, 2.00]"              # every engine of an arm alike
    graph, rest = (float(x.rstrip("%")) for x in cells[9].split(" / "))
    assert graph == pytest.approx(1.51, abs=0.01) and rest == pytest.approx(0.50, abs=0.01)
    assert cells[11] == "MISS"
    assert "pooled over 2 saved runs" in (tmp_path / "p.md").read_text()


def test_pool_refuses_what_it_cannot_pool(tmp_path):
    two = raw(tmp_path / "two.npz", 10, 0, per_arm=2)
    three = raw(tmp_path / "three.npz", 10, 1)
    with pytest.raises(SystemExit, match=r"three.npz in its layout .*--overhead-engines"):
        main(["--pool", str(three), str(two)])
    no_split = raw(tmp_path / "no_split.npz", 10, 2, arms=("off", "on"))
    with pytest.raises(SystemExit, match=r"\('off', 'on'\), 3, 256\) vs"):
        main(["--pool", str(three), str(no_split)])
    short = raw(tmp_path / "short.npz", 10, 3, tokens=128)
    with pytest.raises(SystemExit, match=r"3, 128\) vs .*3, 256\)"):
        main(["--pool", str(three), str(short)])       # no tokens key: saved at 256
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(SystemExit, match="a --raw of the overhead part"):
        main(["--pool", str(tmp_path / "other.npz")])
    with pytest.raises(SystemExit, match="cannot read it"):
        main(["--pool", str(tmp_path / "absent.npz")])


DATA = Path(__file__).resolve().parents[2] / "docs" / "data"


@pytest.mark.parametrize("bench, bs, overhead, from_step, over_engines", [
    ("81bcc1f", 1, "1.19% [-0.52, 2.40]", "0.47% [-0.65, 1.82]", "0.45% [-0.87, 1.75]"),
    ("7e19970", 1, "0.48% [0.37, 0.61]", "0.60% [0.45, 0.70]", "0.61% [0.28, 0.94]"),
])
def test_pool_of_the_recorded_h100_runs(bench, bs, overhead, from_step, over_engines, capsys):
    """The pooled bs 1 rows of docs/results/meter_trust/ come from these files by this command
    (81bcc1f: three arms, 256-token generates; 7e19970: two arms, 128 tokens)."""
    files = [str(DATA / f"meter_overhead_bs{bs}_{bench}_run{i}.npz") for i in (1, 2)]
    assert main(["--pool", *files]) == 0
    cells = row(capsys.readouterr().out)
    assert (cells[4], cells[6], cells[8]) == (overhead, from_step, over_engines)


def test_the_three_recorded_bs1_runs_of_the_two_arm_design(capsys):
    files = [str(DATA / f) for f in ("meter_overhead_bs1_7e19970_run1.npz",
                                     "meter_overhead_bs1_7e19970_run2.npz",
                                     "meter_overhead_bs1_9cc5a3b.npz")]
    assert main(["--pool", *files]) == 0
    cells = row(capsys.readouterr().out)
    assert (cells[4], cells[6], cells[8], cells[11]) == (
        "0.45% [0.36, 0.58]", "0.60% [0.47, 0.71]", "0.52% [0.25, 0.79]", "PASS")


def test_the_recorded_bs32_run(capsys):
    assert main(["--pool", str(DATA / "meter_overhead_bs32_7e19970.npz")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 32 |"))
    assert "| 0.44% [0.05, 0.77] | 0.13% | 0.47% [0.21, 0.77] |" in line
    assert "| 0.17% [-0.19, 0.54] |" in line                  # over its three engines per arm


def test_pool_of_two_arm_runs_has_no_split(tmp_path, capsys):
    a = raw(tmp_path / "a.npz", 30, 0, arms=("off", "on"), tokens=128)
    b = raw(tmp_path / "b.npz", 20, 1, arms=("off", "on"), tokens=128)
    assert main(["--pool", str(a), str(b)]) == 0
    cells = row(capsys.readouterr().out)
    assert cells[4].startswith("2.00% [2.00, 2.00]") and cells[9] == "-"


def test_overhead_two_arms_on_cpu_saves_what_pool_reads_back(tmp_path, capsys):
    """The overhead part end to end on CPU engines (the meter's host-clock stamps): two arms
    (no --split), one engine each, stopped by its time cap after the first repeat; the saved
    raw pools back to the very row the run printed."""
    rows, path = [], tmp_path / "raw.npz"
    overhead(rows, reps=50, tokens=16, raw=str(path), sizes=(1,), per_arm=1, seconds=1e-6)
    table = [ln for ln in rows if ln.startswith("| 1 |")]
    assert len(table) == 1 and rows[-1] == "Repeats run: bs 1: 1."
    assert "not run (add --split)" in "\n".join(rows)
    z = np.load(path)
    assert sorted(z) == ["bs1 eager_per_step", "bs1 off 0", "bs1 off 0 step_p50_ms",
                         "bs1 on 0", "bs1 on 0 step_p50_ms", "bs1 tokens"]
    assert int(z["bs1 tokens"]) == 16 and z["bs1 on 0"].shape == (1,)
    cells = cells_of(table[0])
    assert cells[9] == "-" and float(cells[3]) > 0             # prefill's eager stamps
    assert cells[8] == "- (1 engine per arm)"
    assert main(["--pool", str(path)]) == 0
    assert row(capsys.readouterr().out) == cells


@pytest.mark.parametrize("args, message", [
    (["--overhead-tokens", "8"], "at least 16 decode tokens"),
    (["--overhead-seconds", "0"], "positive number of seconds"),
    (["--overhead-engines", "0"], "at least 1 engine"),
])
def test_overhead_options_refuse_bad_values(args, message, capsys):
    with pytest.raises(SystemExit):
        main(["--only", "overhead", *args])
    assert message in capsys.readouterr().err


def test_host_wake_table_on_cpu():
    """The host-wake part's table (its CPU path: the launches are CPU tensor ops): one row per
    work and wait, a median per d and its rise over d = 0."""
    from mtplab.studies.meter_trust.meter_host_wake import host_wake
    rows = []
    host_wake(rows, reps=2, device="cpu")
    table = [ln for ln in rows if ln.startswith("| ") and not ln.startswith("| work")]
    assert [tuple(cells_of(ln)[:2]) for ln in table] == [
        (w, t) for w in ("python", "launch x6", "launch x6 + sync") for t in ("sleep", "spin")]
    for ln in table:
        cells = cells_of(ln)
        assert len(cells) == 6 and float(cells[2]) > 0
        for c in cells[3:]:
            median, rise = c.rstrip(")").split(" (")
            assert float(median) - float(cells[2]) == pytest.approx(float(rise), abs=0.11)


def test_over_engines_counts_how_far_engines_sit_apart(tmp_path, capsys):
    """Engines with their own fixed speeds (log offsets +a, -a, 0 in the meter arm, +b, -b, 0
    off): the over-engines point stays 2%, and its t interval (4 degrees of freedom) is the
    one written out by hand; the per-repeat interval does not see them."""
    a, b = 0.01, 0.005
    path = raw(tmp_path / "e.npz", 40, 0, eager=False, arms=("off", "on"),
               offsets={"off": (b, -b, 0), "on": (a, -a, 0)})
    assert main(["--pool", str(path)]) == 0
    cells = row(capsys.readouterr().out)
    half = 2.776 * np.sqrt((a * a + b * b) / 3)
    lo, hi = (100 * (1 - 0.98 * np.exp(x)) for x in (half, -half))
    assert cells[8] == f"2.00% [{lo:.2f}, {hi:.2f}]" == "2.00% [0.23, 3.74]"
    assert cells[7] != "0.00%, 0.00%"


def test_pool_keeps_each_runs_engines_apart(tmp_path, capsys):
    """Two runs whose meter engines sit at log offsets (+a, -a, 0) and (-a, +a, 0): pooled,
    "on 0" of one run and "on 0" of the other are different engines, so the over-engines
    interval is over six engines per arm (10 degrees of freedom), not three mixed ones."""
    a = 0.01
    paths = [str(raw(tmp_path / f"run{run}.npz", 30, run, eager=False, arms=("off", "on"),
                     offsets={"on": (sign * a, -sign * a, 0)}))
             for run, sign in enumerate((1, -1))]
    assert main(["--pool", *paths]) == 0
    half = 2.228 * np.sqrt(0.8 * a * a / 6)           # on offsets' variance: 4a² / 5
    lo, hi = (100 * (1 - 0.98 * np.exp(x)) for x in (half, -half))
    assert row(capsys.readouterr().out)[8] == f"2.00% [{lo:.2f}, {hi:.2f}]" == "2.00% [1.20, 2.79]"
