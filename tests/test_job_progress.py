"""The progress line of SlurmJob / SlurmAllocation (no Slurm needed)."""

import io

from hpcmesh.progress import Progress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_off_writes_nothing():
    for stream in (Tty(), io.StringIO()):
        p = Progress(False, stream)
        p.show(("PENDING",), "job 1 PENDING")
        p.done()
        assert stream.getvalue() == ""


def test_progress_on_a_terminal_rewrites_one_line_and_ends_it_once():
    s = Tty()
    p = Progress(True, s)
    p.show((1,), "a long first line")
    p.show((1,), "short")                  # same key: a terminal still shows the new text
    p.done()
    p.done()                               # a second done() adds no empty line
    assert s.getvalue() == "\ra long first line\rshort" + " " * 12 + "\n"


def test_progress_in_a_log_writes_each_change_once():
    class NoTty:                           # a stream without isatty() counts as a log
        def __init__(self):
            self.out = []

        def write(self, text):
            self.out.append(text)

        def flush(self):
            pass
    s = NoTty()
    p = Progress(None, s)
    for key, text in [(("PENDING",), "PENDING 0.1s"), (("PENDING",), "PENDING 0.2s"),
                      (("RUNNING",), "RUNNING 1.0s"), (("PENDING",), "PENDING again")]:
        p.show(key, text)
    p.done()
    assert s.out == ["hpcmesh: PENDING 0.1s\n", "hpcmesh: RUNNING 1.0s\n",
                     "hpcmesh: PENDING again\n"]
