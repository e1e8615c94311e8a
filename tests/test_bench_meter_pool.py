"""benchmarks/bench_meter.py --pool: saved overhead runs pooled (no GPU). Planted rates: the
meter arm exactly 2% slower than off, the unstamped arm 0.5% slower, so every column is
known."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench_meter import OVERHEAD_ARMS, main


def raw(path, reps: int, seed: int, eager: bool = True, per_arm: int = 3):
    rng = np.random.default_rng(seed)
    machine = 3000 * np.exp(rng.normal(0, 0.05, reps))        # shared by every engine
    slow = {"off": 1.0, "on": 0.98, "unstamped": 0.995}
    z = {}
    for a in OVERHEAD_ARMS:
        for i in range(per_arm):
            z[f"bs1 {a} {i}"] = machine * slow[a]
            z[f"bs1 {a} {i} step_p50_ms"] = 1e3 / (machine * slow[a])
    if eager:
        z["bs1 eager_per_step"] = np.array(0.25)
    np.savez(path, **z)
    return path


def row(out: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if ln.startswith("| 1 |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_pool_reads_planted_ratios_back(tmp_path, capsys):
    a, b = raw(tmp_path / "a.npz", 50, 0), raw(tmp_path / "b.npz", 40, 1, eager=False)
    assert main(["--pool", str(a), str(b), "--out", str(tmp_path / "p.md")]) == 0
    cells = row(capsys.readouterr().out)
    assert cells[3] == "0.2"                                  # mean of the runs that counted
    assert cells[4].startswith("2.00% [2.00, 2.00]") and cells[5] == "2.00%"
    assert cells[6].startswith("2.00%") and cells[7] == "0.00%, 0.00%"
    graph, rest = (float(x.rstrip("%")) for x in cells[8].split(" / "))
    assert graph == pytest.approx(1.51, abs=0.01) and rest == pytest.approx(0.50, abs=0.01)
    assert cells[10] == "MISS"
    assert "pooled over 2 saved runs" in (tmp_path / "p.md").read_text()


def test_pool_refuses_what_it_cannot_pool(tmp_path):
    two = raw(tmp_path / "two.npz", 10, 0, per_arm=2)
    three = raw(tmp_path / "three.npz", 10, 1)
    with pytest.raises(SystemExit, match="differ in engines per arm"):
        main(["--pool", str(three), str(two)])
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(SystemExit, match="three-arm layout"):
        main(["--pool", str(tmp_path / "other.npz")])
    with pytest.raises(SystemExit, match="cannot read it"):
        main(["--pool", str(tmp_path / "absent.npz")])


def test_pool_of_the_recorded_h100_runs(capsys):
    """docs/benchmarks.md's pooled bs 1 row comes from these two files by this command."""
    from pathlib import Path
    data = Path(__file__).resolve().parents[1] / "docs" / "data"
    files = [str(data / f"meter_overhead_bs1_81bcc1f_run{i}.npz") for i in (1, 2)]
    assert main(["--pool", *files]) == 0
    cells = row(capsys.readouterr().out)
    assert cells[4] == "1.19% [-0.52, 2.40]" and cells[6] == "0.47% [-0.65, 1.82]"
