"""`mtplab report`: dated reports, written from their results (studies/reports.py).

    mtplab report regime                    # every regime report again from its results file,
                                            # the index and the README's headline
    mtplab report all --check               # exit 1 naming each file that would change
    mtplab report regime --from SWEEP_DIR --command "mtplab bench --groups regime ..."
                                            # a new dated report from a regime sweep
    mtplab report whatif --from RUN_A/regime RUN_B/regime --command "..."
                                            # one what-if report from two regime runs
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Optional

from ..atomic import atomic_write_text
from ..errors import ConfigError
from . import QUESTIONS, STUDIES, reports as results, study


def _parser() -> argparse.ArgumentParser:
    from ..flags import FlagParser
    p = FlagParser(prog="mtplab report", description=__doc__.splitlines()[0])
    p.add_argument("question", help=f"{' | '.join(sorted(STUDIES))} | all")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming each report, the index or the README "
                        "headline that differs from what its results give")
    p.add_argument("--root", type=Path, default=None, metavar="DIR",
                   help=f"the results folder (default: {results.RESULTS})")
    p.add_argument("--readme", type=Path, default=None, metavar="FILE",
                   help=f"the README whose headline the newest regime report writes "
                        f"(default: {results.README})")
    p.add_argument("--from", dest="sweep", type=Path, nargs="+", default=None,
                   metavar="SWEEP_DIR",
                   help="write a new dated report from this sweep's results.parquet (whatif: "
                        "one or more regime runs' folders, one report)")
    p.add_argument("--command", default=None,
                   help="with --from: the command that ran the sweep, as the report names it")
    p.add_argument("--date", default=None, metavar="YYYY-MM-DD",
                   help="with --from: the day it ran (default: today)")
    p.add_argument("--device", default=None, metavar="NAME",
                   help="with --from: the device's short name (default: from the cells' "
                        "device_name, e.g. h200)")
    return p


def headline(root: Optional[Path], readme: Path) -> Optional[str]:
    """The README's text with its headline from the newest regime report (None: no report)."""
    newest = results.newest("regime", root)
    if newest is None:
        return None
    doc = results.load(newest)
    link = Path(newest).resolve().relative_to(readme.resolve().parent)
    body = study("regime").readme_block(doc, link.as_posix())
    return results.with_block(readme.read_text(), body, readme)


def run(args) -> int:
    root = args.root or results.RESULTS
    if not Path(root).is_dir():
        raise ConfigError(f"{root} is not a folder: run from a checkout of mtplab or pass "
                          "--root DIR.")
    questions = sorted(STUDIES) if args.question == "all" else [args.question]
    mod = study(questions[0]) if args.question != "all" else None
    if args.sweep is not None:
        if mod is None:
            raise ConfigError("--from writes one question's report: name the question.")
        if not hasattr(mod, "report"):
            raise ConfigError(f"{args.question}'s reports are not written from a sweep's "
                              f"folder: `{mod.WRITER}` writes them.")
        path = mod.report(args.sweep, root=root, device=args.device,
                          command=args.command or f"mtplab bench --groups {args.sweep[0].name}",
                          date=args.date or datetime.date.today().isoformat())
        print(f"wrote {path}")
    changed = [p for q in questions
               for p in results.regenerate(q, study(q).render, root, check=args.check)]
    index = Path(root) / results.INDEX
    text = results.index_md(QUESTIONS, root)
    if not index.is_file() or index.read_text() != text:
        changed.append(index)
        if not args.check:
            atomic_write_text(index, text)
    readme = args.readme or results.README
    if "regime" in questions and readme.is_file():
        text = headline(root, readme)
        if text is not None and text != readme.read_text():
            changed.append(readme)
            if not args.check:
                atomic_write_text(readme, text)
    for p in changed:
        print(f"{'differs' if args.check else 'wrote'}: {p}")
    return 1 if args.check and changed else 0


def main_report(argv: Optional[list] = None) -> int:
    args = _parser().parse(sys.argv[1:] if argv is None else argv)
    if isinstance(args, int):
        return args
    try:
        return run(args)
    except ConfigError as e:
        print(f"mtplab report: error: {e}", file=sys.stderr)
        return 2
