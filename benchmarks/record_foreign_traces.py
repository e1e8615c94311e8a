"""Record Kineto traces of programs that are not mtplab, cut pieces of them, print their
bubble causes. The study `analyser` (mtplab/studies/analyser/foreign_traces.py)."""
from mtplab.studies.analyser.foreign_traces import main

if __name__ == "__main__":
    raise SystemExit(main())
