"""mtplab and SGLang side by side on the same workload, each in a worker process of its own.
The study `peers` (mtplab/studies/peers/side_by_side.py; `--out-dir DIR` writes its dated
report, DIR/peers/<YYYY-MM-DD>_<device>_<commit>.{md,json})."""
from mtplab.studies.peers.side_by_side import main

if __name__ == "__main__":
    raise SystemExit(main())
