"""The device time the meter's stamps add to each segment graph of a decode step (part
`cost`)."""
from __future__ import annotations

from collections import Counter

from mtplab import Engine, RunConfig

from .meter_common import BASE, OVERLAP, prompts


def stamp_cost(rows: list, reps: int = 300, data: dict | None = None) -> None:
    """Device time of each segment graph of a frozen decode step, captured with and without
    the meter's stamps, replayed back to back behind a GPU sleep (device time only).
    `data` (given) gets one record per bs and graph under "stamp_cost"."""
    import torch
    rows += ["", f"Stamp device cost (tiny-code frozen, fold_seed, overlap + zero_bubble; each "
             f"segment graph replayed {reps}x back to back, µs per replay; stamps in the "
             f"graph):", "",
             "| bs | graph | stamps (nodes) | meter off µs | meter on µs | added µs |",
             "|---|---|---|---|---|---|"]
    from mtplab.instrument.meter import BubbleMeter
    for bs in (1, 32):
        per: dict = {}
        for on in (False, True):
            nodes: Counter = Counter()          # stamp nodes captured, by code
            real = BubbleMeter.device_stamp
            BubbleMeter.device_stamp = lambda self, code, nodes=nodes, real=real: (
                nodes.update([code]), real(self, code))[1]
            try:
                eng = Engine(RunConfig(**BASE, **OVERLAP["on+zb"], bubble_meter=on,
                                       max_running_requests=bs))
            finally:
                BubbleMeter.device_stamp = real
            eng.generate(prompts(eng, bs), max_new_tokens=16, ignore_eos=True)
            for name, r in eng.worker.executor.graphs.items():
                g = r.graphs[r.bucket(bs)][0]
                for _ in range(3):
                    g.replay()
                a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                torch.cuda._sleep(20_000_000)
                a.record()
                for _ in range(reps):
                    g.replay()
                b.record()
                b.synchronize()
                per.setdefault(name, {})[on] = (a.elapsed_time(b) / reps * 1e3, len(r.stamps),
                                                sum(nodes[c] for c in set(r.stamps))
                                                // len(r.graphs))
            del eng           # (replays by hand are outside the meter's log: never collected)
        if data is not None:
            data.setdefault("stamp_cost", []).extend(
                {"bs": bs, "graph": name, "stamps": v[True][1], "nodes": v[True][2],
                 "off_us": float(v[False][0]), "on_us": float(v[True][0]), "replays": reps}
                for name, v in per.items())
        for name, v in per.items():
            rows.append(f"| {bs} | {name} | {v[True][1]} ({v[True][2]}) | {v[False][0]:.1f} | "
                        f"{v[True][0]:.1f} | {v[True][0] - v[False][0]:+.1f} |")
        off, on = (sum(v[k][0] for v in per.values()) for k in (False, True))
        n, k = (sum(v[True][i] for v in per.values()) for i in (1, 2))
        rows.append(f"| {bs} | **all ({len(per)})** | {n} ({k}) | {off:.1f} | {on:.1f} | "
                    f"**{on - off:+.1f}** |")
