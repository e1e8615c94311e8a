"""A test of the tests: each mutant below is a small bug planted in a copy of the package (one
exact source edit); the fast tests named beside it must then fail. A mutant whose old text is
not found exactly once fails as stale, so the table cannot rot silently. The same tests pass
on the package as it is (they are in the fast set).

Each mutant runs pytest in a subprocess on a temporary copy of mtplab/ and tests/ (so the
copy, not this checkout, is imported)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Mutant(NamedTuple):
    file: str                 # under mtplab/
    old: str                  # found exactly once
    new: str
    tests: tuple[str, ...]    # node ids that must each fail


OVERLAP = "tests/sched/test_overlap.py::"
EXACT = "tests/speculative/test_spec_exact.py::"
IDENTICAL = OVERLAP + "test_identical_tokens_overlap_off_on_zero_bubble"

MUTANTS = {
    # the overlap loop processes step k-1's results before launching step k: silently serial
    "overlap_loop_serial": Mutant(
        "sched/scheduler.py",
        "            prev, self.in_flight = self.in_flight, self._launch(kind, batch)\n"
        "            if prev is not None:\n"
        "                self._waited = prev.kind\n"
        "                self.process_result(prev)\n",
        "            prev = self.in_flight\n"
        "            if prev is not None:\n"
        "                self._waited = prev.kind\n"
        "                self.process_result(prev)\n"
        "            self.in_flight = self._launch(kind, batch)\n",
        (OVERLAP + "test_overlap_launches_a_step_before_it_processes_the_decode_before[none]",)),
    # the host's KV bound forgets the step in flight (max_kv too small under overlap)
    "no_in_flight_bound": Mutant(
        "sched/scheduler.py",
        "self.lag = alloc_len_per_decode if loop.overlap else 0",
        "self.lag = 0",
        (IDENTICAL + "[none-16-random]",
         OVERLAP + "test_overlap_gives_target_only_tokens_on_random_weights[none]")),
    # EAGLE writes branch t's draft KV at the linear offset t*S, reads it at the page-aligned one
    "eagle_branch_offset_not_page_aligned": Mutant(
        "speculative/draft_kv.py",
        "return (base + last)[:, None, None] + t * region[:, None, None] + s",
        "return (base + last)[:, None, None] + t * num_steps + s",
        (EXACT + "test_eagle_drafts_the_same_candidates_at_every_page_size[random]",)),
    # topk > 1: the accepted path's KV is not moved to the front of the verify window
    "no_compaction_at_topk_gt_1": Mutant(
        "speculative/segments.py",
        "p.num_draft_tokens, move_kv=p.topk > 1)",
        "p.num_draft_tokens, move_kv=False)",
        (IDENTICAL + "[eagle-16-4-3-8-False-agreeable]",)),
    # the last tree node is never accepted (accept length off by one; tokens still right)
    "accept_last_node_never": Mutant(
        "speculative/accept.py",
        "alive = nxt < D ",
        "alive = nxt < D - 1 ",
        (EXACT + "test_a_draft_that_is_the_target_is_accepted_whole_on_every_verify"
                 "[frozen_kv_mtp-False]",)),
    # resolve reads the future map by batch position, not by row (right until rows are reused)
    "resolve_by_position": Mutant(
        "sched/future_map.py",
        "        s = self.seq_lens[rows]\n",
        "        s = self.seq_lens[1:rows.shape[0] + 1]\n",
        (IDENTICAL + "[none-16-random]",)),
    # publish: the new lengths are published one short
    "publish_one_short": Mutant(
        "sched/future_map.py",
        "pub = [RowMove(self.seq_lens, seq_lens)]",
        "pub = [RowMove(self.seq_lens, seq_lens - 1)]",
        (IDENTICAL + "[frozen_kv_mtp-16-4-3-8-True-random]",)),
    # stash: EAGLE's step-0 top-k is never stashed (the draft starts from stale candidates)
    "stash_drops_eagle_topk": Mutant(
        "sched/future_map.py",
        "if self.topk_logp is not None and x.topk_logp is not None:",
        "if False:",
        (EXACT + "test_a_draft_that_is_the_target_is_accepted_whole_on_every_verify"
                 "[eagle-16]",)),
    # d2h: the pinned readback slot never rotates (step k's copy overwrites k-1's unread results)
    "d2h_one_slot": Mutant(
        "sched/d2h.py",
        "self.i = (self.i + 1) % SLOTS",
        "self.i = 0",
        (IDENTICAL + "[none-16-random]",)),
    # the seed step: the next Frozen-KV seed runs on the first accepted token, not the bonus
    "seed_on_the_wrong_token": Mutant(
        "speculative/draft_frozen.py",
        "last accepted node).\"\"\"\n        return DraftInputs(bonus, hidden_last)",
        "last accepted node).\"\"\"\n        return DraftInputs(tokens[:, 0], hidden_last)",
        (EXACT + "test_a_draft_that_is_the_target_is_accepted_whole_on_every_verify"
                 "[frozen_kv_mtp-False]",)),
    # chunked prefill: the fill token after a non-final chunk is off by one (the draft's input)
    "chunk_next_token_off_by_one": Mutant(
        "sched/prepare.py",
        "nxt = [f[e] if e < len(f) else -1 for f, e in zip(fills, ends)]",
        "nxt = [f[e - 1] if e < len(f) else -1 for f, e in zip(fills, ends)]",
        ("tests/sched/test_chunked_prefill.py::"
         "test_eagle_draft_kv_after_chunks_equals_whole_prefill",)),
}


def planted_copy(tmp: Path, m: Mutant) -> Path:
    """A copy of mtplab/, tests/ and the pytest configuration with `m` applied."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in ("mtplab", "tests"):
        shutil.copytree(ROOT / d, tmp / d, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    path = tmp / "mtplab" / m.file
    src = path.read_text()
    n = src.count(m.old)
    assert n == 1, (f"stale mutant: its old text occurs {n} times in mtplab/{m.file} (not "
                    f"once); update the table to the code.")
    path.write_text(src.replace(m.old, m.new))
    return tmp


def failed_tests(tmp: Path, node_ids: tuple[str, ...]) -> tuple[set, str]:
    """Run the node ids in the copy: (node ids that failed or errored, the output)."""
    report = tmp / "report.xml"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-m", "", f"--junitxml={report}", *node_ids],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    out = r.stdout[-4000:] + r.stderr[-2000:]
    assert report.exists(), out
    bad = set()
    for case in ET.parse(report).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            path = case.get("classname").replace(".", "/") + ".py"
            bad.add(f"{path}::{case.get('name')}")
    return bad, out


@pytest.mark.slow
@pytest.mark.parametrize("name", MUTANTS)
def test_each_mutant_fails_its_tests(tmp_path, name):
    m = MUTANTS[name]
    tmp = planted_copy(tmp_path, m)
    bad, out = failed_tests(tmp, m.tests)
    survived = [t for t in m.tests if t not in bad]
    assert not survived, f"mutant {name} survived {survived}:\n{out}"


def test_every_mutant_applies_to_the_code_as_it_is():
    """Each mutant's old text occurs exactly once in its file, and each test file it names
    exists (the slow test then plants it)."""
    for name, m in MUTANTS.items():
        assert (ROOT / "mtplab" / m.file).read_text().count(m.old) == 1, f"stale mutant {name}"
        for t in m.tests:
            assert (ROOT / t.split("::")[0]).exists(), (name, t)
