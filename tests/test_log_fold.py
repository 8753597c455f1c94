"""The folding of alike log lines (hpcmesh.runtime.observe.log_fold): pure, no processes."""

import pytest

from hpcmesh.runtime.observe.log_fold import (MAX_GROUPS, LogFolder, TimedFolders, alike_key,
                                              describe_ranks, fold_prefix)
from hpcmesh.shapes import Extent, Point


def test_lines_that_differ_only_in_numbers_are_alike():
    assert alike_key("step 10 loss 0.31") == alike_key("step 11 loss 0.29") == "step # loss #"
    assert alike_key("lr 1e-05 grad -3.5 at 0x7f3a00") == "lr # grad # at #"
    assert alike_key("cuda:0 ready") == alike_key("cuda:7 ready")
    assert alike_key("step 10 loss nan") != alike_key("step 10 loss 0.31")
    assert alike_key("epoch 1 done") != alike_key("epoch 1 failed")


def test_a_window_folds_alike_lines_with_count_and_ranks_in_first_seen_order():
    f = LogFolder(3.0)
    assert f.deadline is None and f.take(100.0, force=True) == []
    f.add(10.0, "stdout", "step 10 loss 0.31", ["r1"])
    f.add(10.5, "stdout", "hello", ["r0"])
    f.add(11.0, "stdout", "step 10 loss 0.29", ["r0"])
    f.add(11.0, "stderr", "step 10 loss 0.29", ["r0"])    # another stream: not alike
    f.add(12.0, "stdout", "step 10 loss 0.30", ["r1"], count=2)
    assert f.deadline == 13.0 and len(f) == 3
    assert f.take(12.9) == []                   # still open
    folds = f.take(13.0)
    assert [(x.stream, x.text, x.count, list(x.ranks)) for x in folds] == [
        ("stdout", "step 10 loss 0.31", 4, ["r1", "r0"]),
        ("stdout", "hello", 1, ["r0"]),
        ("stderr", "step 10 loss 0.29", 1, ["r0"])]
    assert f.deadline is None and len(f) == 0
    f.add(20.0, "stdout", "x", ["r2"])          # the next line opens a new window
    assert f.deadline == 23.0
    assert [x.text for x in f.take(20.0, force=True)] == ["x"]


def test_a_full_window_is_due_at_once_and_zero_is_one_batch():
    f = LogFolder(60.0, max_groups=3)
    for i, word in enumerate(["a", "b", "c"]):
        f.add(5.0 + i, "stdout", word, [0])
    assert f.deadline == 5.0 and len(f.take(7.0)) == 3
    z = LogFolder(0)
    z.add(1.0, "stdout", "x 1", [0])
    z.add(1.0, "stdout", "x 2", [1])
    assert [(x.count, list(x.ranks)) for x in z.take(1.0)] == [(2, [0, 1])]
    with pytest.raises(ValueError, match="seconds >= 0"):
        LogFolder(-1)


def _pts(extent, ranks):
    ext = Extent(extent)
    return [Point(r, ext) for r in ranks]


def test_ranks_are_described_compactly():
    full = {"hosts": 32, "gpus": 8}
    assert describe_ranks(_pts(full, range(256))) == "hosts=0..31,gpus=0..7"
    assert describe_ranks(_pts(full, [9])) == "hosts=1,gpus=1"
    assert describe_ranks(_pts(full, [0, 8, 16])) == "hosts=0..2,gpus=0"
    assert describe_ranks(_pts(full, [0, 1, 2, 3, 5])) == "hosts=0,gpus={0..3,5}"
    # all but one member: two blocks
    assert describe_ranks(_pts(full, [r for r in range(256) if r != 3 * 8 + 5])) == (
        "hosts={0..2,4..31},gpus=0..7; hosts=3,gpus={0..4,6,7}")
    assert describe_ranks(_pts({"gpus": 8}, [6, 7, 0])) == "gpus={0,6,7}"
    assert describe_ranks(_pts({}, [0])) == "0"
    assert describe_ranks(_pts({"hosts": 2, "gpus": 4}, range(8))) == "hosts=0..1,gpus=0..3"
    # host h has gpus 0..h: ten different blocks, two past the cap
    many = describe_ranks(_pts({"hosts": 10, "gpus": 10},
                               [h * 10 + g for h in range(10) for g in range(h + 1)]))
    assert many.startswith("hosts=0,gpus=0; hosts=1,gpus=0..1; hosts=2,gpus=0..2;")
    assert many.endswith("; +2 more") and many.count(";") == 8


def test_a_single_line_keeps_the_plain_prefix():
    assert fold_prefix(1, "gpus=3") == "[gpus=3] "
    assert fold_prefix(8, "gpus=0..7") == "[8 similar log lines, gpus=0..7] "


class _FakeLoop:
    """time() and call_at() of an asyncio loop, driven by hand."""

    def __init__(self):
        self.now = 0.0
        self.timers = []

    def time(self):
        return self.now

    def call_at(self, when, fn, *args):
        loop = self

        class Handle:
            cancelled = False

            def when(self):
                return when

            def cancel(self):       # as asyncio's: a no-op once it ran
                self.cancelled = True
                if self in loop.timers:
                    loop.timers.remove(self)
        h = Handle()
        h.run = lambda: fn(*args)
        self.timers.append(h)
        return h

    def advance(self, to):
        self.now = to
        for h in sorted(self.timers, key=lambda h: h.when()):
            if h.when() <= to and h in self.timers:
                self.timers.remove(h)
                h.run()


def test_timed_folders_emit_each_window_when_it_closes_and_on_flush():
    loop, emitted = _FakeLoop(), []
    tf = TimedFolders(loop, lambda key, folds: emitted.append(
        (key, [(f.text, f.count, list(f.ranks)) for f in folds])))
    assert not tf
    tf.add("a", 2.0, "stdout", "step 1", ["p0"])
    loop.advance(1.0)
    tf.add("a", 2.0, "stdout", "step 2", ["p1"])
    tf.add("b", 5.0, "stdout", "other", ["q0"])
    assert tf and len(loop.timers) == 2 and emitted == []
    loop.advance(2.0)                           # a's window (opened at 0) closes
    assert emitted == [("a", [("step 1", 2, ["p0", "p1"])])]
    tf.flush("b")                               # early: its process ended, say
    assert emitted[-1] == ("b", [("other", 1, ["q0"])]) and loop.timers == []
    tf.flush("b")                               # nothing open: nothing emitted
    assert len(emitted) == 2 and not tf


def test_a_full_window_is_emitted_at_once():
    loop, emitted = _FakeLoop(), []
    tf = TimedFolders(loop, lambda key, folds: emitted.append(len(folds)))
    for i in range(MAX_GROUPS):
        tf.add("k", 60.0, "stdout", f"line {'x' * i}", [0])
    assert [h.when() for h in loop.timers] == [0.0]     # rearmed to the window's start
    loop.advance(0.0)
    assert emitted == [MAX_GROUPS]
