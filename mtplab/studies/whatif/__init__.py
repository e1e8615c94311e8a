"""Study `whatif`: does the what-if predictor get the measured ratios right?

Grid: the regime ladder (studies/regime/regime.yaml: every cell records its step profile).
Check: check.py (`validate`: each pair of arms differing in one knob, the ratio predicted from
the baseline's run beside the one measured, judged where the effect exceeds the noise).
"""
