"""Study `spec_schedule`: which draft setting pays at which batch size, and what a batch-aware
schedule gains over the best static setting.

Grid: schedule.yaml (`mtplab bench --groups schedule`). Runner: runner.py (one process per
model: the break-even surface, the best schedule as YAML, its gain on a varying batch).
"""
