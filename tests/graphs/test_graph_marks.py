"""GraphRunner's marks (graphs/runner.py `_Marks`): the stamps of one capture, in order,
issued as stamp nodes or handed to the segment's one self-stamping kernel (`carry`). The
capture itself needs a GPU (tests/gpu); the issue order is checked here with a recording
meter."""
from __future__ import annotations

import pytest
import torch

from mtplab.graphs.runner import GraphRunner, _Marks
from mtplab.instrument.meter import launch_codes, stamp_code
from mtplab.speculative import tree
from mtplab.speculative.draft_select import StepCandidates


class _Meter:
    """Records the stamp nodes a capture would issue."""
    stamp_code = staticmethod(stamp_code)
    launch_codes = staticmethod(launch_codes)

    def __init__(self):
        self.nodes, self.ring, self.count = [], "ring", "count"

    def device_stamp(self, code):
        self.nodes.append(code)


def _runner(stages, carry_begin=False, meter=True):
    m = _Meter() if meter else None
    r = GraphRunner(lambda **kw: None, dict(rows=torch.zeros(4, dtype=torch.long)),
                    dict(rows=0), [4], meter=m, stage=stages, carry_begin=carry_begin)
    return r, m


def test_marks_issue_every_stamp_as_a_node_in_stage_order():
    r, m = _runner(("commit", "publish", "stash"))
    marks = _Marks(r, warm=False)
    marks("publish")
    marks("stash")
    marks.finish()
    assert m.nodes == list(r.stamps) and len(r.stamps) == 4
    assert r.stamps[-1] == stamp_code("stash", "forward", True)


def test_a_carrying_kernel_takes_the_stamps_still_to_come():
    r, m = _runner(("commit", "publish", "stash"))
    marks = _Marks(r, warm=False)
    ring, count, codes, done = marks.carry("publish", "stash")
    marks.finish()
    assert m.nodes == [r.stamps[0]]                      # only the begin is a node
    assert codes == r.stamps[1:] and (ring, count, done) == ("ring", "count", r._done)


def test_resolve_carries_its_begin_and_end():
    r, m = _runner("resolve", carry_begin=True)
    marks = _Marks(r, warm=False)
    assert marks.carry("resolve")[2] == r.stamps == (stamp_code("resolve", "forward", False),
                                                     stamp_code("resolve", "forward", True))
    marks.finish()
    assert m.nodes == []


def test_warm_up_runs_issue_no_node_and_carry_into_the_scratch_ring():
    r, m = _runner(("commit", "publish", "stash"))
    marks = _Marks(r, warm=True)
    marks("publish")
    ring, count, codes, _ = marks.carry("stash")
    marks.finish()
    assert m.nodes == [] and (ring, count) == r._scratch and codes == r.stamps[2:]


def test_without_a_meter_the_kernel_carries_nothing():
    r, _ = _runner(("verify", "publish", "stash"), meter=False)
    marks = _Marks(r, warm=False)
    assert marks.carry("publish", "stash") is None
    marks.finish()


def test_marks_reject_stages_out_of_order_or_left_out():
    r, _ = _runner(("commit", "publish", "stash"))
    with pytest.raises(ValueError, match="in the order"):
        _Marks(r, warm=False)("stash")
    with pytest.raises(ValueError, match="remaining stages"):
        _Marks(r, warm=False).carry("stash")
    marks = _Marks(r, warm=False)
    marks("publish")
    with pytest.raises(ValueError, match="were begun"):
        marks.finish()


def test_a_first_kernel_carries_the_begin_and_a_last_kernel_the_end():
    """tree: [organize{b tree}, build_tree{e tree}] -- no stamp node at all."""
    r, m = _runner("tree", carry_begin=True)
    marks = _Marks(r, warm=False)
    b, e = marks.begin(), marks.carry()
    marks.finish()
    assert m.nodes == [] and b.codes + e.codes == r.stamps
    assert (b.ring, b.count, b.done) == ("ring", "count", r._done)


def test_commit_carries_its_begin_and_hands_the_rest_to_the_future_map_kernel():
    r, m = _runner(("commit", "publish", "stash"), carry_begin=True)
    marks = _Marks(r, warm=False)
    assert marks.begin().codes == r.stamps[:1]
    assert marks.carry("publish", "stash").codes == r.stamps[1:]
    marks.finish()
    assert m.nodes == []


def test_the_begin_is_carried_once_and_only_where_the_runner_says():
    with pytest.raises(ValueError, match="carry_begin"):
        _Marks(_runner("tree")[0], warm=False).begin()
    marks = _Marks(_runner("tree", carry_begin=True)[0], warm=False)
    marks.begin()
    with pytest.raises(ValueError, match="once"):
        marks.begin()
    forgot = _Marks(_runner("tree", carry_begin=True)[0], warm=False)
    with pytest.raises(ValueError, match="were begun"):      # nobody took the begin
        forgot.finish()



def _tree_runner(fn):
    m = _Meter()
    m.ring, m.count = torch.zeros(8, 2, dtype=torch.long), torch.zeros(1, dtype=torch.int32)
    r = GraphRunner(fn, dict(rows=torch.zeros(1, dtype=torch.long)), dict(rows=0), [1],
                    meter=m, stage="tree", carry_begin=True,
                    carry_ops=("organize", "build_tree"))
    return r, m


STEPS = [StepCandidates(torch.tensor([[4, 5, 6]]), torch.tensor([[0.9, 0.5, 0.7]]),
                        torch.tensor([[-1, -1, 0]]))]


def test_dispatched_ops_take_the_stamps_their_segment_names():
    """tree: [organize{b tree}, build_tree{e tree}]. The stage code passes no stamp: inside
    the capture `dispatch` hands organize the begin and build_tree the end (carry_ops); off
    CUDA each runs its reference between stamp records, with no stamp node."""
    r, m = _tree_runner(lambda rows, mark: tree.build_tree(tree.organize(STEPS, 3), rows,
                                                           rows + 2))
    r._call(dict(rows=torch.zeros(1, dtype=torch.long)), warm=False)
    assert m.nodes == [] and int(m.count[0]) == 2
    assert m.ring[:2, 0].tolist() == list(r.stamps)


def test_a_carrying_op_dispatched_twice_in_its_segment_is_refused():
    def fn(rows, mark):
        tree.organize(STEPS, 3)
        tree.organize(STEPS, 3)
    r, _ = _tree_runner(fn)
    with pytest.raises(ValueError, match="once"):
        r._call(dict(rows=torch.zeros(1, dtype=torch.long)), warm=False)
