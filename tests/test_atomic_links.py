"""No write follows a symbolic link out of its folder: an atomic write replaces the link
itself, a file written in place refuses it (mtplab/atomic.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtplab import cli
from mtplab.atomic import (LinkedFileError, atomic_write_json, atomic_write_text,
                           open_in_place)
from mtplab.sweep.lock import OutDirLocked, hold_out_dir
from mtplab.sweep.results import append_record

VICTIM = "the victim's own text\n"


@pytest.fixture
def victim(tmp_path) -> Path:
    p = tmp_path / "victim.txt"
    p.write_text(VICTIM)
    return p


def _link(folder: Path, name: str, target: Path) -> Path:
    folder.mkdir(exist_ok=True)
    link = folder / name
    link.symlink_to(target)
    return link


def test_sweep_replaces_a_linked_grid_copy_and_leaves_its_target(tmp_path, victim,
                                                                 monkeypatch):
    # mkdir o; ln -s $PWD/victim.txt o/grid.yaml; mtplab sweep g.yaml --out o
    monkeypatch.chdir(tmp_path)
    grid = "base: {page_size: 3, device: cpu}\narms: [{overlap: false}]\n"  # one dropped cell
    Path("g.yaml").write_text(grid)
    link = _link(tmp_path / "o", "grid.yaml", victim)
    assert cli.main(["sweep", "g.yaml", "--out", "o", "--no-progress"]) == 0
    assert victim.read_text() == VICTIM
    assert not link.is_symlink() and link.read_text() == grid


@pytest.mark.parametrize("write", [
    lambda p: atomic_write_text(p, "new"),
    lambda p: atomic_write_json(p, {"new": 1}),
], ids=["text", "json"])
def test_an_atomic_write_replaces_the_link_itself(tmp_path, victim, write):
    link = _link(tmp_path / "o", "out.json", victim)
    write(link)
    assert victim.read_text() == VICTIM and not link.is_symlink() and "new" in link.read_text()


@pytest.mark.parametrize("mode", ["a", "ab", "wb", "rb+"])
def test_a_write_in_place_refuses_a_link(tmp_path, victim, mode):
    link = _link(tmp_path / "o", "log", victim)
    with pytest.raises(LinkedFileError, match="is a symbolic link .* remove the link"):
        open_in_place(link, mode)
    assert victim.read_text() == VICTIM


def test_the_sweep_journal_and_lock_refuse_links(tmp_path, victim):
    out = tmp_path / "o"
    journal = _link(out, "results.jsonl", victim)
    with pytest.raises(LinkedFileError, match="results.jsonl is a symbolic link"):
        append_record(journal, {"cell_id": "x"})
    _link(out, ".lock", victim)
    with pytest.raises(OutDirLocked, match=r"\.lock is a symbolic link"):
        with hold_out_dir(out):
            pass
    assert victim.read_text() == VICTIM


def test_a_sweep_whose_journal_is_a_link_exits_2_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("g.yaml").write_text("base: {page_size: 3, device: cpu}\narms: [{overlap: false}]\n")
    empty = tmp_path / "empty.txt"        # read as an empty journal; the first record refused
    empty.touch()
    _link(tmp_path / "o", "results.jsonl", empty)
    assert cli.main(["sweep", "g.yaml", "--out", "o", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "results.jsonl is a symbolic link" in err, err
    assert empty.read_text() == ""
