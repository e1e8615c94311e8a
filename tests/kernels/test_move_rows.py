"""The future map's one-kernel row moves (kernels/move_rows.py) against their plain-torch
reference: resolve's gathers with padding lanes, publish + stash scatters with a dtype cast,
columns across several blocks, and the stamps the kernel carries (first program, split,
last program out) with its done counter back at zero. Runs under TRITON_INTERPRET=1 here
(the clock from a tensor, as in tests/instrument/test_meter.py); the GPU engine tests run it
captured."""
from __future__ import annotations

import pytest
import torch

from mtplab.kernels.move_rows import MAX_MOVES, RowMove, move_rows_ref, move_rows_triton
from tests.helpers import sm90_ptx

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
T = 10**15 + 4242                                      # an ns-sized clock value


def _stamps(count0: int = 0):
    ring = torch.zeros(8, 2, dtype=torch.long, device=DEVICE)
    count = torch.tensor([count0], dtype=torch.int32, device=DEVICE)
    return ring, count


def _gather_moves(g, lanes: int, R: int, H: int):
    """The resolve of a frozen draft with pre-drafted candidates: lengths (+1 on a target
    decode), bonus to two graphs, hidden, scores, parents (pad -1)."""
    seq = torch.randint(1, 100, (R + 1,), generator=g)
    bonus = torch.randint(0, 50, (R + 1,), generator=g)
    hidden = torch.randn(R + 1, H, generator=g).to(torch.bfloat16)
    scores = torch.randn(R + 1, 6, generator=g)
    parents = torch.randint(0, 6, (R + 1, 6), generator=g)
    z = lambda *s, dt=torch.long: torch.full(s, 99, dtype=dt)      # noqa: E731  stale values
    return [RowMove(z(lanes), seq, pad=1, add=1), RowMove(z(lanes), bonus),
            RowMove(z(lanes), bonus), RowMove(z(lanes, H, dt=torch.bfloat16), hidden),
            RowMove(z(lanes, 6, dt=torch.float32), scores),
            RowMove(z(lanes, 6), parents, pad=-1)]


def _to(moves, dev):
    return [RowMove(m.dst.clone().to(dev), m.src.to(dev), m.pad, m.add) for m in moves]


@pytest.mark.parametrize("H", [8, 600])               # one column block, three
@pytest.mark.parametrize("stamped", [False, True])
def test_resolve_gather_matches_reference_with_padding_lanes(H, stamped):
    g = torch.Generator().manual_seed(H)
    rows = torch.tensor([4, 0, 9, 1, 0, 0])            # lanes 1, 4, 5: graph padding
    moves = _gather_moves(g, rows.shape[0], 10, H)
    ref = _to(moves, "cpu")
    ring, count = _stamps(6)                             # the two records wrap the ring
    done = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    move_rows_triton(rows.to(DEVICE), k := _to(moves, DEVICE), True, 0,
                     (ring, count, (30, 31), done) if stamped else None,
                     torch.tensor([T], device=DEVICE))
    rr, rc = torch.zeros(8, 2, dtype=torch.long), torch.tensor([6], dtype=torch.int32)
    move_rows_ref(rows, ref, True, 0, (rr, rc, (30, 31)) if stamped else None, lambda: T)
    for a, b in zip(k, ref):
        assert torch.equal(a.dst.cpu(), b.dst)
    assert ref[0].dst[1] == 1 and ref[0].dst[0] == moves[0].src[4] + 1   # pad; value + add
    assert (ref[5].dst[4] == -1).all() and (ref[3].dst[5] == 0).all()
    assert torch.equal(ring.cpu(), rr) and int(count[0]) == int(rc[0]) == (8 if stamped else 6)
    assert int(done[0]) == 0                              # reset by the last program out


@pytest.mark.parametrize("H", [8, 600])
def test_publish_stash_scatter_matches_reference_with_its_split_stamp(H):
    """commit's tail: publish (lengths) then stash (bonus cast to int64, hidden): three
    stamps, the middle one where program (0, 0) crosses into the stash moves."""
    g = torch.Generator().manual_seed(H + 1)
    R, rows = 12, torch.tensor([5, 2, 11, 7])
    new_seq = torch.randint(1, 100, (4,), generator=g)
    bonus = torch.randint(0, 50, (4,), generator=g, dtype=torch.int32)
    hidden = torch.randn(4, H, generator=g).to(torch.bfloat16)

    def moves(dev):
        fm = [torch.full((R + 1,), -1, dtype=torch.long), torch.full((R + 1,), -1),
              torch.zeros(R + 1, H, dtype=torch.bfloat16)]
        return [RowMove(d.to(dev), s.to(dev)) for d, s in zip(fm, (new_seq, bonus, hidden))]
    k, ref = moves(DEVICE), moves("cpu")
    ring, count = _stamps()
    done = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    for t in (T, T + 1):                                  # twice: the done counter resets
        move_rows_triton(rows.to(DEVICE), k, False, 1, (ring, count, (40, 41, 42), done),
                         torch.tensor([t], device=DEVICE))
    rr, rc = torch.zeros(8, 2, dtype=torch.long), torch.zeros(1, dtype=torch.int32)
    for t in (T, T + 1):
        move_rows_ref(rows, ref, False, 1, (rr, rc, (40, 41, 42)), lambda t=t: t)
    for a, b in zip(k, ref):
        assert torch.equal(a.dst.cpu(), b.dst)
    assert torch.equal(ref[1].dst[rows], bonus.long()) and ref[1].dst[0] == -1
    assert rr[:6, 0].tolist() == [40, 41, 42] * 2
    assert torch.equal(ring.cpu(), rr) and int(count[0]) == 6 and int(done[0]) == 0


def test_row_moves_reject_bad_input():
    rows = torch.tensor([1, 2], device=DEVICE)
    ok = RowMove(torch.zeros(2, dtype=torch.long, device=DEVICE),
                 torch.zeros(5, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="1 to 8 moves"):
        move_rows_triton(rows, [ok] * (MAX_MOVES + 1), True)
    with pytest.raises(ValueError, match=r"lanes for 2 rows"):
        move_rows_triton(rows, [RowMove(torch.zeros(3, dtype=torch.long, device=DEVICE),
                                        ok.src)], True)
    ring, count = _stamps()
    with pytest.raises(ValueError, match="split move"):
        move_rows_triton(rows, [ok, ok], True, 0, (ring, count, (1, 2, 3), count))
    with pytest.raises(ValueError, match="split move"):
        move_rows_ref(rows, [ok, ok], True, 1, (ring, count, (1, 2)), lambda: 0)


def test_move_rows_compiles_for_sm90_with_three_stamps_and_a_last_program_counter(monkeypatch):
    """Compiled ahead of time for an H100 (the interpreter cannot run %globaltimer): a
    publish + stash scatter reads the timer three times; its slot claims are relaxed and the
    done counter, which orders the end stamp after every program's moves, is acq_rel."""
    import mtplab.kernels.move_rows as fmk
    sig = {"Rows": "*i64", "done_ptr": "*i32", "ring_ptr": "*i64", "count_ptr": "*i32",
           "clock_ptr": "*i64", "c0": "i32", "c1": "i32", "c_end": "i32", "mask": "i32"}
    const = dict(N=3, SPLIT=1, GATHER=False, STAMP=True, GLOBALTIMER=True, BLOCK=256)
    fields = [("*i64", 1), ("*i64", 1), ("*bf16", 512)]          # lengths, bonus, hidden
    for k in range(fmk.MAX_MOVES):
        dt, w = fields[k] if k < len(fields) else ("*i64", 0)
        sig.update({f"D{k}": dt, f"S{k}": dt})
        const.update({f"W{k}": w, f"SS{k}": w, f"DS{k}": w, f"P{k}": 0, f"A{k}": 0})
    ptx = sm90_ptx(monkeypatch, fmk._move_rows_kernel, sig, const,
                   do_not_specialize=["c0", "c1", "c_end", "mask"])
    assert ptx.count("%globaltimer") == 3
    atoms = [ln.strip() for ln in ptx.splitlines() if "atom.global" in ln]
    assert all(a.startswith("@%p") for a in atoms)                 # one thread each
    assert sum(".relaxed" in a for a in atoms) == 3 and sum("acq_rel" in a for a in atoms) == 1
