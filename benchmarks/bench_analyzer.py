"""Trace analyser speed: mtplab vs HTA on one large trace, and their idle times side by side.
The study `analyser` (mtplab/studies/analyser/trace_speed.py; `--out-dir DIR` writes its dated
report, DIR/analyser/<YYYY-MM-DD>_<device>_<commit>.{md,json})."""
from mtplab.studies.analyser.trace_speed import main

if __name__ == "__main__":
    raise SystemExit(main())
