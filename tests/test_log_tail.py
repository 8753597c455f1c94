"""``hpcmesh.log_tail``, the one way an error shows the end of a log: pure, on temp files."""

import os
import threading

from hpcmesh.log_tail import TAIL_BYTES, log_tail


def test_the_last_lines_without_blank_ones(tmp_path):
    log = tmp_path / "x.err"
    log.write_bytes(b"one\ntwo\n\n   \nthree \xff\n\n")
    assert log_tail(str(log), 2) == "two\nthree \ufffd"       # undecodable bytes replaced
    assert log_tail(str(log), 10, sep=" | ") == "one | two | three \ufffd"
    assert log_tail(str(log), 0) == ""


def test_only_the_end_of_a_big_log_is_read(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("early\n" * 100_000 + "x" * TAIL_BYTES + "\nTraceback\nBoom\n")
    # the line the window cuts is left out, not shown half
    assert log_tail(str(log), 15) == "Traceback\nBoom"


def test_no_log_gives_nothing(tmp_path):
    assert log_tail(None, 5) == "" and log_tail("", 5) == ""
    assert log_tail(str(tmp_path / "missing"), 5) == ""
    assert log_tail(str(tmp_path), 5) == ""                   # a folder


def test_a_fifo_in_a_logs_place_does_not_hang(tmp_path):
    fifo = tmp_path / "x.err"
    os.mkfifo(fifo)
    got = []
    t = threading.Thread(target=lambda: got.append(log_tail(str(fifo), 5)), daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive() and got == [""]
