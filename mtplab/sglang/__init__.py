"""Drive a real SGLang server with mtplab's knobs: RunConfig -> server arguments and environment
(args.py), a native-API HTTP driver (client.py) and `mtplab sglang launch` (cli.py).
Imports mtplab's config and core only, never the engine."""
