"""Dated reports: every answer mtplab gives about speed is a Markdown file written by code from
the results kept beside it.

    docs/results/<question>/<YYYY-MM-DD>_<device>_<commit>.md      the report (never edited)
    docs/results/<question>/<YYYY-MM-DD>_<device>_<commit>.json    its results: what it is
                                                                    rendered from
    docs/results/<question>/legacy.md      figures measured before their data was kept:
                                           historical, not indexed
    docs/results/README.md                 the index: one row per question, its newest answer

A report's file name is its stamp (`Stamp`): the date it was measured, the device (a short
lower-case name: h100, h200, cpu), and the commit of the code that measured it (reachable
from main). The results file holds the stamp again, the command, the software and the
study's own data; `render` (the study's) turns it into the Markdown byte for byte, so
`mtplab report QUESTION` regenerates every report of a question, and `--check` says which
file would change.

Every report names each ratio with its noise and one verdict of `VERDICTS` (`verdict`), and
carries one line starting `ANSWER` (the answer in a sentence, with its figures): the index
quotes that line, so a report written by any study (or by another generator following this
naming rule) gets its row.
"""
from __future__ import annotations

import json
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..atomic import atomic_write_text
from ..errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
INDEX = "README.md"
LEGACY = "legacy.md"
ANSWER = "**Answer:**"            # the line of a report the index quotes
NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})_([a-z0-9-]+)_([0-9a-f]{7,40})$")

PAYS, COSTS, NOISE, ONE_REPEAT = "pays", "costs", "within the noise", "one repeat, no verdict"
VERDICTS = (PAYS, COSTS, NOISE, ONE_REPEAT)
MIN_NOISE = 0.02                  # studies/effects.py's floor: a ratio within 2% of 1 never pays


@dataclass(frozen=True)
class Stamp:
    """When, where and from which code a report was measured: its file name."""
    date: str                      # YYYY-MM-DD
    device: str                    # h100, h200, cpu, ...
    commit: str                    # short hash, reachable from main

    def __post_init__(self):
        if not NAME.match(self.stem):
            raise ConfigError(f"report stamp {self.stem!r}: write the date as YYYY-MM-DD, the "
                              "device in lower case letters, digits or '-' (h200), and the "
                              "commit as 7-40 hex digits.")

    @property
    def stem(self) -> str:
        return f"{self.date}_{self.device}_{self.commit}"

    @classmethod
    def of(cls, path: Path) -> "Stamp":
        m = NAME.match(Path(path).stem)
        if not m:
            raise ConfigError(f"{path}: a report's name is <YYYY-MM-DD>_<device>_<commit>.md.")
        return cls(*m.groups())


def ok_cells(results):
    """The cells of a sweep's results table that ran (status ok; all when it has no status)."""
    return results[results["status"] == "ok"] if "status" in results else results


def cells_stamp(tables, again: str) -> tuple[str, list[str]]:
    """(the short commit, the sorted device names) of the cells in `tables` (ok cells of one
    or more results tables): one commit of a clean tree, else ConfigError ending in `again`
    (what to run again at one commit)."""
    commits, names = set(), set()
    for ok in tables:
        commits |= {str(c) for c in ok["git_commit"].dropna()} if "git_commit" in ok else set()
        names |= {str(n) for n in ok["device_name"].dropna()} if "device_name" in ok else set()
    commits = sorted(commits)
    if len(commits) != 1 or commits[0].endswith("-dirty"):
        raise ConfigError(f"the cells ran at commits {commits or ['unknown']}: a report names "
                          f"one commit of a clean tree; {again} at one commit.")
    return commits[0][:7], sorted(names)


def report_commit(commit: Optional[str]) -> str:
    """The commit a report names (short) of provenance.git_commit's answer: a clean tree's;
    ConfigError for none or "-dirty" (a report written by a benchmark script)."""
    if not commit or commit.endswith("-dirty"):
        raise ConfigError(f"commit {commit or 'unknown'}: a report names one commit of a clean "
                          "tree; commit the changes, or set MTP_GIT_COMMIT to the commit a "
                          "copied tree was made from.")
    return commit[:7]


def checkout_commit(prog: str) -> Optional[str]:
    """The commit a runner's report will name (`report_commit` of provenance.git_commit:
    MTP_GIT_COMMIT where set, else this checkout's clean HEAD), checked before the runner
    measures anything. None after printing `prog: <why>` on stderr: the runner exits 2."""
    from ..provenance import git_commit
    try:
        return report_commit(git_commit())
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None


def plain(v: Any) -> Any:
    """A value as a results file holds it: plain Python throughout (numpy / torch scalars
    unwrapped, tuples as lists), NaN as None (strict JSON)."""
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and math.isnan(v) else v


def stamped(doc: dict, *, date: str, device: str, device_name: str, commit: Optional[str],
            command: str, software: str = "", note: str = "") -> dict:
    """`doc` with its stamp (`commit`: report_commit's) and the command that measured it."""
    return {**doc, "date": date, "device": device, "device_name": device_name,
            "commit": report_commit(commit), "command": command, "software": software,
            "note": note}


def measured_here(doc: dict, *, device: str, commit: Optional[str], command: str,
                  note: str = "") -> dict:
    """`doc` as a results file (plain) stamped with today's date and this process's `device`
    ('cuda', 'cpu', ...): its name and slug, torch's version and, on CUDA, Triton's."""
    import torch
    cuda = torch.device(device).type == "cuda"
    name = torch.cuda.get_device_name() if cuda else "cpu"
    software = f"torch {torch.__version__}"
    if cuda:
        import triton
        software += f"; triton {triton.__version__}"
    return plain(stamped(doc, date=time.strftime("%Y-%m-%d"), device=device_slug(name),
                         device_name=name, commit=commit, command=command, software=software,
                         note=note))


def device_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', '' or 'cpu' -> 'cpu'."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", name or "")
    return m.group(1).lower() if m else "cpu"


def verdict(ratio: float, noise: float, n: int, n_base: int) -> str:
    """The verdict on a tok/s ratio (arm / baseline) with its noise (a fraction): a verdict
    needs two repeats a side (one repeat measures no spread); within the noise when
    |ratio - 1| <= noise (studies/effects.py's rule, in the reports' words)."""
    if min(n, n_base) < 2:
        return ONE_REPEAT
    if not abs(ratio - 1.0) > noise:
        return NOISE
    return PAYS if ratio > 1.0 else COSTS


def ratio_text(ratio: float, noise: float, v: str) -> str:
    """'1.486x ±6.4%, pays' (v: its `verdict`)."""
    return "-" if ratio != ratio else f"{ratio:.3f}x ±{noise:.1%}, {v}"


def num(v: Any, spec: str) -> str:
    """A number for a table cell, '-' for a missing one."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def plan_shape(row: dict) -> str:
    """A decode GEMM plan row's shape (Engine.gemm_plan): "N x K", "+ RoPE" where both arms
    ran the RoPE epilogue (cuBLAS then the RoPE kernel, against the fused kernel)."""
    rope = " + RoPE" if row.get("epilogue") == "rope" else ""
    return f"{row['n']} x {row['k']}{rope}"


def md_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def note_and_answer(doc: dict, answer: str) -> list[str]:
    """A report's lines after its header: the run's note (if any), then the answer line the
    index quotes."""
    return ([doc["note"], ""] if doc.get("note") else []) + [f"{ANSWER} {answer}"]


def header(doc: dict, title: str) -> str:
    """The lines every report opens with: title, date, device, commit, command, results."""
    s = stamp_of(doc)
    lines = [f"# {title}", "",
             f"- date: {s.date}",
             f"- device: {s.device}" + (f" ({doc['device_name']})" if doc.get("device_name")
                                        else ""),
             f"- commit: `{s.commit}`",
             f"- command: `{doc['command']}`"]
    if doc.get("software"):
        lines.append(f"- software: {doc['software']}")
    lines.append(f"- results: [{s.stem}.json]({s.stem}.json); this report is written from "
                 f"them by `mtplab report {doc['question']}`")
    return "\n".join(lines)


def stamp_of(doc: dict) -> Stamp:
    return Stamp(doc["date"], doc["device"], doc["commit"])


# -- files ---------------------------------------------------------------------------------
def question_dir(question: str, root: Optional[Path] = None) -> Path:
    return Path(root or RESULTS) / question


def reports(question: str, root: Optional[Path] = None) -> list[Path]:
    """The dated reports of a question, oldest first (by date, then name)."""
    d = question_dir(question, root)
    paths = [p for p in d.glob("*.md") if NAME.match(p.stem)] if d.is_dir() else []
    return sorted(paths, key=lambda p: (Stamp.of(p).date, p.name))


def newest(question: str, root: Optional[Path] = None) -> Optional[Path]:
    rs = reports(question, root)
    return rs[-1] if rs else None


def load(path: Path) -> dict:
    """A report's results file (path: the .md or the .json), its stamp checked against its
    name."""
    path = Path(path).with_suffix(".json")
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no results beside the report; a report is written from "
                          "its results (mtplab report QUESTION --from RUN_DIR).") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not a results file ({e}); write it again with the study's "
                          "runner.") from None
    if stamp_of(doc).stem != path.stem:
        raise ConfigError(f"{path}: its date/device/commit ({stamp_of(doc).stem}) differ from "
                          "its name; rename the file or fix the fields.")
    return doc


def dump(doc: dict) -> str:
    """A results file's text: keys in order, one line per key, a list one item per line (a
    diff shows the rows that changed); strict JSON (a missing value is null)."""
    def one(v):
        return json.dumps(v, sort_keys=True, allow_nan=False, ensure_ascii=False)

    items = []
    for k, v in sorted(doc.items()):
        if isinstance(v, list) and v:
            v = "[\n" + ",\n".join(f"  {one(x)}" for x in v) + "\n ]"
        else:
            v = one(v)
        items.append(f" {one(k)}: {v}")
    return "{\n" + ",\n".join(items) + "\n}\n"


def write(doc: dict, render: Callable[[dict], str], root: Optional[Path] = None) -> Path:
    """Write a new report and its results (atomically); returns the report's path."""
    d = question_dir(doc["question"], root)
    stem = stamp_of(doc).stem
    atomic_write_text(d / f"{stem}.json", dump(doc))
    atomic_write_text(d / f"{stem}.md", render(doc))
    return d / f"{stem}.md"


def write_merged(doc: dict, render: Callable[[dict], str], root: Optional[Path],
                 merge: Callable[[dict, dict], dict]) -> Path:
    """`write`, where a report of the same stamp exists already: merge(its results, doc)
    goes in its place, so that a runner's calls at one stamp build one report."""
    old = question_dir(doc["question"], root) / f"{stamp_of(doc).stem}.json"
    return write(merge(load(old), doc) if old.is_file() else doc, render, root)


def regenerate(question: str, render: Callable[[dict], str], root: Optional[Path] = None,
               check: bool = False) -> list[Path]:
    """Render every report of a question from its results; returns the reports that differed
    (written unless `check`)."""
    changed = []
    for jp in sorted(question_dir(question, root).glob("*.json")):
        if not NAME.match(jp.stem):
            continue
        doc = load(jp)
        text = render(doc)
        md = jp.with_suffix(".md")
        if not md.is_file() or md.read_text() != text:
            changed.append(md)
            if not check:
                atomic_write_text(md, text)
    return changed


# -- the index -------------------------------------------------------------------------------
def answer_line(path: Path) -> str:
    """The report's answer: the text after ANSWER on its line."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(ANSWER):
            return line[len(ANSWER):].strip()
    raise ConfigError(f"{path}: a report carries one line starting {ANSWER!r} (the index "
                      "quotes it).")


def index_md(questions: dict[str, str], root: Optional[Path] = None) -> str:
    """docs/results/README.md: one row per question (those of `questions`, question ->
    what it asks, then any other folder holding dated reports): its newest answer, device,
    date and link. A question without a dated report says so; legacy.md files are not
    indexed."""
    root = Path(root or RESULTS)
    extra = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in questions
                   and reports(p.name, root)) if root.is_dir() else []
    rows = []
    for q in [*questions, *extra]:
        p = newest(q, root)
        ask = questions.get(q, "")
        if p is None:
            rows.append([f"`{q}`", ask, "no dated report yet", "-", "-", "-"])
            continue
        s = Stamp.of(p)
        rows.append([f"`{q}`", ask, answer_line(p), s.device, s.date,
                     f"[{p.name}]({q}/{p.name})"])
    lines = ["# Results", "",
             "One row per question: its newest dated report. Each report is written by code "
             "from the results file beside it (`mtplab report QUESTION` regenerates it; "
             "`--check` verifies), named `<YYYY-MM-DD>_<device>_<commit>.md`. A folder's "
             "`legacy.md` keeps figures measured before their data was kept: historical, not "
             "indexed. How the figures are measured: [method.md](method.md). This file is "
             "written by `mtplab report`.", "",
             md_table(["question", "asks", "newest answer", "device", "date", "report"], rows),
             ""]
    return "\n".join(lines)


# -- the README's headline -----------------------------------------------------------------------
README = REPO / "README.md"
HEADLINE_BEGIN = ("<!-- headline: written by `mtplab report regime` from the newest regime "
                  "report -->")
HEADLINE_END = "<!-- /headline -->"


def with_block(text: str, body: str, path: Path) -> str:
    """`text` with the lines between HEADLINE_BEGIN and HEADLINE_END replaced by `body`."""
    try:
        head, rest = text.split(HEADLINE_BEGIN + "\n", 1)
        _, tail = rest.split(HEADLINE_END, 1)
    except ValueError:
        raise ConfigError(f"{path}: no headline block; put the two lines {HEADLINE_BEGIN!r} "
                          f"and {HEADLINE_END!r} where it goes.") from None
    return f"{head}{HEADLINE_BEGIN}\n{body.rstrip()}\n{HEADLINE_END}{tail}"


def block(text: str) -> str:
    """The headline block's body in a README's text ('' without one)."""
    if HEADLINE_BEGIN not in text:
        return ""
    return text.split(HEADLINE_BEGIN + "\n", 1)[1].split(HEADLINE_END, 1)[0].rstrip()
