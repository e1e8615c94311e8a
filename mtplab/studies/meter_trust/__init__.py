"""Study `meter_trust`: can the bubble meter (and the event timeline) be trusted, and what do
they cost? Its runners, one module per part:

    meter_bench.py       `python -m benchmarks.bench_meter`: runs the parts below in order
    meter_common.py      the workload (tiny-code frozen, the planted-delay regimes), planted waits
    meter_resolution.py  stamp resolution, an eager stamp's host cost, wake-up latency after idle
    meter_host_wake.py   how much slower the host's next work is after it was away
    meter_stamp_cost.py  the stamps' device time per segment graph
    meter_planted.py     planted host delays per step, the meter's rise against d
    meter_profiler.py    meter vs profiler (backlogged, host-bound; the planted delays)
    meter_overhead.py    decode tok/s meter on vs off, engines interleaved; --pool of saved runs
    meter_split.py       the meter's cost outside its graphs, by part
    profile_bench.py     `python -m benchmarks.bench_profile`: event timeline vs profiler
    plain_trace.py       `python -m benchmarks.record_plain_trace`: plain PyTorch traces
"""
