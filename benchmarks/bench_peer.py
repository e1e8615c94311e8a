"""mtplab beside Hugging Face transformers (greedy and assisted generation) on the same
weights. The study `peers` (mtplab/studies/peers/hf_peer.py)."""
from mtplab.studies.peers.hf_peer import main

if __name__ == "__main__":
    raise SystemExit(main())
