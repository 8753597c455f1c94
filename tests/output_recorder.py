"""A stand-in for sys.stdout/sys.stderr shared by the runtime tests."""

import sys
import time


class Recorder:
    """Stands in for sys.stdout/sys.stderr: records what the controller's runtime thread
    writes (polling capfd from the test thread can lose a line written concurrently)."""

    def __init__(self):
        self.chunks = []

    def write(self, s):
        self.chunks.append(s)
        return len(s)

    def flush(self):
        pass

    def text(self):
        return "".join(self.chunks)

    def wait_for(self, *needles, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not all(n in self.text() for n in needles) and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.text()

    @classmethod
    def install(cls, monkeypatch, name):
        # in the test body: pytest's own capture re-sets sys.stdout/err when a test starts
        rec = cls()
        monkeypatch.setattr(sys, name, rec)
        return rec
