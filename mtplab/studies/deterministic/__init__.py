"""Study `deterministic`: what batch-invariant mode costs, and how often bf16 spec output
diverges from target-only without it. Runner: deterministic_bench.py
(`python -m benchmarks.bench_deterministic`)."""
