"""The parts of the bubble meter's validation, one module each; `python -m
benchmarks.bench_meter` (benchmarks/bench_meter.py: what each part measures and its target)
runs them.

    common.py      the workload (tiny-code frozen, the planted-delay regimes), planted waits
    resolution.py  stamp resolution, an eager stamp's host cost, wake-up latency after idle
    host_wake.py   how much slower the host's next work is after it was away
    stamp_cost.py  the stamps' device time per segment graph
    planted.py     planted host delays per step, the meter's rise against d
    profiler.py    meter vs profiler (backlogged, host-bound; the planted delays)
    overhead.py    decode tok/s meter on vs off, engines interleaved; --pool of saved runs
    split.py       the meter's cost outside its graphs, by part
"""
