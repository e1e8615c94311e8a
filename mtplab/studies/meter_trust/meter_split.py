"""The meter's cost outside its graphs, by part: unstamped graphs, then the d2h kernel
unstamped too, against two meter-off engines (part `split`)."""
from __future__ import annotations

import numpy as np

from .meter_common import prompts, sig
from .meter_overhead import _engine, _rotate


def quiet_d2h(eng) -> None:
    """This engine's d2h copy kernel runs unstamped (its codes are not logged either): with
    `unstamped_graphs`, what is left of the meter is the step span, span lookups and
    prefill's eager stamps."""
    import mtplab.sched.d2h as d2h
    m, copy = eng.meter, d2h.stamped_copy_triton
    if not hasattr(d2h, "_quiet_rings"):
        d2h._quiet_rings = set()

        def stamped_copy(host, results, stamp=None):
            if stamp is not None and id(stamp[0]) in d2h._quiet_rings:
                stamp = None
            copy(host, results, stamp)
        d2h.stamped_copy_triton = stamped_copy
    d2h._quiet_rings.add(id(m.ring))
    codes, log = m.kernel_stamp("d2h", "copy").codes, m.log
    m.log = lambda c: None if c == codes else log(c)


def split(rows: list, reps: int = 101, tokens: int = 256, data: dict | None = None) -> None:
    """The meter's cost outside its graphs, by parts: engines off a / off b (A/A), the meter
    on with unstamped graphs (U), and U with an unstamped d2h kernel too (UD); interleaved,
    the order rotating. `data` (given) gets every engine's tok/s per repeat under "split"."""
    rows += ["", f"Meter cost outside the graphs (as the overhead part, {reps} repeats; U = meter "
             "on, graphs unstamped; UD = U with the d2h kernel unstamped; each 1 - median "
             "ratio):", "",
             "| bs | off tok/s | A/A off b vs a | U vs off | UD vs off | d2h stamps (U vs UD) |",
             "|---|---|---|---|---|---|"]
    names = ("off a", "off b", "U", "UD")
    for bs in (1, 32):
        engs = {n: _engine(bs, meter=n in ("U", "UD"), graph_stamps=False) for n in names}
        quiet_d2h(engs["UD"])
        ps = prompts(engs["off a"], bs)
        for e in engs.values():
            e.generate(ps, max_new_tokens=16, ignore_eos=True)
        r, _ = _rotate(engs, ps, reps, tokens)
        if data is not None:
            data.setdefault("split", []).append(
                {"bs": bs, "tokens": tokens, "rates": {n: sig(v) for n, v in r.items()}})
        off = np.sqrt(r["off a"] * r["off b"])

        def ov(x, y):
            return f"{100 * (1 - float(np.median(x / y))):.2f}%"
        rows.append(f"| {bs} | {np.median(off):.0f} | {ov(r['off b'], r['off a'])} | "
                    f"{ov(r['U'], off)} | {ov(r['UD'], off)} | {ov(r['U'], r['UD'])} |")
        del engs
