"""Logs at scale (SPEC §11, issue 30 item 4): ``logging_option(aggregate_window_sec=...)``
folds alike lines on each host and again across hosts; ``ranks=`` chooses which reach the
console; every process's log file keeps every line. Real processes, two local host agents."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest
from output_recorder import Recorder

from hpcmesh.actor import Actor, SupervisionError, current_rank, endpoint, this_host
from hpcmesh.job import ProcessJob
from hpcmesh.runtime.client import existing_client_runtime


class Printer(Actor):
    @endpoint
    def step(self, n: int, tag: str) -> int:
        r = current_rank().rank
        print(f"{tag} step {n} loss {0.3 + r / 100:.2f}", flush=True)
        return r


def _wait(cond, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _files_have(procs, tag: str) -> bool:
    """Every process's stdout log file holds its own line tagged ``tag``."""
    texts = [open(p["stdout"]).read() for p in procs.log_paths]
    return all(re.search(rf"^{tag} step \d+ loss 0\.{30 + r}$", t, re.M)
               for r, t in enumerate(texts))


@pytest.fixture(scope="module")
def two_hosts():
    """2 hosts (local agents, each its own process) x 4 processes, and their Printers."""
    job = ProcessJob({"hosts": 2})
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs({"gpus": 4})
        yield procs, procs.spawn("printer", Printer)
    finally:
        job.kill()


def test_alike_lines_fold_on_each_host_and_again_across_hosts(two_hosts, monkeypatch):
    procs, printer = two_hosts
    rt = existing_client_runtime()
    host_folds = []           # what the hosts sent: their folds, before the client's
    # the console's handler of what the hosts folded, spied on
    monkeypatch.setattr(rt.console, "fold", lambda window, folds, fold=rt.console.fold: (
        host_folds.extend(folds), fold(window, folds)))
    out = Recorder.install(monkeypatch, "stdout")
    asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=2))
    printer.step.call(10, "folded").get(timeout=60)
    line = re.compile(r"^\[8 similar log lines, hosts=0\.\.1,gpus=0\.\.3\] "
                      r"folded step 10 loss 0\.3\d$", re.M)
    _wait(lambda: line.search(out.text()), "the folded line")
    assert out.text().count("folded step") == 1, out.text()
    _wait(lambda: _files_have(procs, "folded"), "every line in the log files")
    # each host folded its own processes' lines before they travelled
    mine = [f for f in host_folds if "folded step" in f[1]]
    assert sum(f[2] for f in mine) == 8 and max(f[2] for f in mine) > 1, mine
    assert all(len(names) == count for _s, _t, count, names in mine), mine
    hosts = [{procs.records[int(n.rsplit("-", 1)[1])].point["hosts"] for n in f[3]}
             for f in mine]
    assert all(len(h) == 1 for h in hosts), hosts

    # None: each line as it comes, prefixed, as before
    asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=None))
    printer.step.call(11, "plain").get(timeout=60)
    want = [f"[hosts={r // 4},gpus={r % 4}] plain step 11 loss 0.{30 + r}\n" for r in range(8)]
    _wait(lambda: all(w in out.text() for w in want), "every plain line")
    assert not re.search("similar log lines.*plain", out.text())


def test_the_rank_filter_chooses_the_console_and_the_files_keep_all(two_hosts, monkeypatch):
    procs, printer = two_hosts
    out = Recorder.install(monkeypatch, "stdout")
    asyncio.run(procs.logging_option(stream_to_client=True, ranks={"gpus": 0}))
    printer.step.call(12, "filtered").get(timeout=60)
    _wait(lambda: _files_have(procs, "filtered"), "every line in the log files")
    # a fence: each host's agent read its filtered lines before this one (they were in the
    # files), and sends in order, so what it forwarded of them is printed before the fence
    printer.slice(gpus=0).step.call(13, "fence").get(timeout=60)
    _wait(lambda: "[hosts=0,gpus=0] fence" in out.text()
          and "[hosts=1,gpus=0] fence" in out.text(), "the fence lines")
    text = out.text()
    assert "[hosts=0,gpus=0] filtered step 12 loss 0.30" in text
    assert "[hosts=1,gpus=0] filtered step 12 loss 0.34" in text
    assert text.count("filtered step") == 2, text

    # with folding, in a window longer than the test: ranks of this view, host 0 only
    asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=600,
                                     ranks=[0, 1, 2, 3]))
    printer.step.call(14, "some").get(timeout=60)
    _wait(lambda: _files_have(procs, "some"), "every line in the log files")
    assert "some step" not in out.text()
    # new settings: the agents send what they folded first, then answer; then the client
    asyncio.run(procs.logging_option(stream_to_client=True))
    rt = existing_client_runtime()
    rt.node.run_sync(asyncio.sleep(0, rt.flush_logs()))
    assert re.search(r"^\[4 similar log lines, hosts=0,gpus=0\.\.3\] some step 14 loss "
                     r"0\.3[0-3]$", out.text(), re.M), out.text()
    assert out.text().count("some step") == 1, out.text()


def test_bad_rank_filters_are_named(two_hosts):
    procs, _ = two_hosts
    with pytest.raises(ValueError, match=r"9 is not a rank of this mesh of 8 \(0\.\.7\)"):
        asyncio.run(procs.logging_option(stream_to_client=True, ranks=[0, 9]))
    with pytest.raises(TypeError, match="a rank, a list of ranks"):
        asyncio.run(procs.logging_option(stream_to_client=True, ranks="0,1"))
    with pytest.raises(ValueError, match="needs stream_to_client=True"):
        asyncio.run(procs.logging_option(ranks=[0]))
    with pytest.raises(ValueError, match="seconds >= 0"):
        asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=-1))
    with pytest.raises(KeyError, match="nodes"):
        asyncio.run(procs.logging_option(stream_to_client=True, ranks={"nodes": 0}))


def test_stop_prints_what_is_still_folded(monkeypatch):
    """8 processes on this host, a window far longer than the test: stop() itself prints
    the folded line, and the log files have every line."""
    out = Recorder.install(monkeypatch, "stdout")
    procs = this_host().spawn_procs(per_host={"gpus": 8})
    try:
        asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=600))
        procs.spawn("printer", Printer).step.call(20, "last").get(timeout=60)
        _wait(lambda: _files_have(procs, "last"), "every line in the log files")
        assert "last step" not in out.text()          # folded, in its window
    finally:
        procs.stop().get(timeout=60)
    assert re.search(r"^\[8 similar log lines, gpus=0\.\.7\] last step 20 loss 0\.3\d$",
                     out.text(), re.M), out.text()


class Mortal(Actor):
    @endpoint
    def die(self) -> None:
        print("last words", flush=True)
        os._exit(3)


def test_a_process_that_dies_has_its_folded_lines_printed_at_once(monkeypatch):
    """Its failure is news now: what it printed last is not kept for the window's end."""
    out = Recorder.install(monkeypatch, "stdout")
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=600))
        with pytest.raises(SupervisionError):
            procs.spawn("mortal", Mortal).slice(gpus=1).die.call_one().get(timeout=60)
        _wait(lambda: "[gpus=1] last words\n" in out.text(), "its last words")
    finally:
        procs.stop().get(timeout=60)
