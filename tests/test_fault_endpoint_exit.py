"""Mistakes in user code fail that call or that spawn, with what to write instead: sys.exit()
or KeyboardInterrupt inside an endpoint fails that actor, as in Monarch, not the process
(real processes). Before, an async endpoint run inline took its whole process down with it."""

from __future__ import annotations

import os
import sys

import pytest

from hpcmesh.actor import Actor, SupervisionError, endpoint, this_host


class Quitter(Actor):
    @endpoint
    async def exit_async(self, code: int) -> None:
        sys.exit(code)

    @endpoint
    async def interrupt_async(self) -> None:
        raise KeyboardInterrupt

    @endpoint
    def exit_sync(self, code: int) -> None:
        sys.exit(code)

    @endpoint
    async def die(self, code: int) -> None:
        os._exit(code)

    @endpoint
    async def ping(self) -> str:
        return "pong"


@pytest.fixture(scope="module")
def procs():
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    yield procs
    procs.stop().get(timeout=30)


@pytest.mark.parametrize("call, kind", [("exit_async", "SystemExit"),
                                        ("interrupt_async", "KeyboardInterrupt"),
                                        ("exit_sync", "SystemExit")])
def test_an_endpoint_that_exits_fails_its_actor_and_the_process_goes_on(procs, call, kind):
    quitter = procs.spawn(f"quitter_{call}", Quitter)
    args = (3,) if "exit" in call else ()
    with pytest.raises(SupervisionError, match=f"{kind}.* raised in Quitter.{call}") as ei:
        getattr(quitter, call).call_one(*args).get(timeout=30)
    assert "and all its descendants have failed" in str(ei.value)
    with pytest.raises(SupervisionError, match=f"Endpoint call quitter_{call}.ping"):
        quitter.ping.call_one().get(timeout=30)
    assert procs.spawn("after", Quitter).ping.call_one().get(timeout=30) == "pong"


@pytest.mark.parametrize("bad", ["gpus", 8, ["gpus", 2]])
def test_per_host_that_is_not_a_mapping_says_what_it_takes(bad):
    # before: "dictionary update sequence element #0 has length 1; 2 is required"
    with pytest.raises(TypeError, match=r"per_host must be a mapping of dimension names to "
                                        r"sizes, like per_host=\{'gpus': 8\}"):
        this_host().spawn_procs(per_host=bad)


def test_calls_to_an_actor_whose_process_died_say_so_in_monarchs_words():
    """The call that was waiting when its process exited, and one made after, each name
    themselves and the actor there first, then the process's facts (issue 32 item 3)."""
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        diers = procs.spawn("diers", Quitter)
        one = diers.slice(gpus=1)
        words = (r"The actor <test_fault_endpoint_exit\.Quitter diers\{'gpus': 1/2\}> and all its "
                 r"descendants have failed: the process this actor was running on exited with "
                 r"non-zero code 7 \(process gpus=1 of mesh '\w+' on host \S+, pid \d+: exit "
                 r"code 7\)$")
        with pytest.raises(SupervisionError, match=r"^Endpoint call diers\.die\(\) failed, "
                           + words):
            one.die.call_one(7).get(timeout=30)
        with pytest.raises(SupervisionError, match=r"^Endpoint call diers\.ping\(\) failed, "
                           + words):
            one.ping.call_one().get(timeout=30)
        with pytest.raises(SupervisionError, match=r"^Endpoint call diers\.ping\(\) failed, "
                           + words):
            diers.ping.call().get(timeout=30)
        assert diers.slice(gpus=0).ping.call_one().get(timeout=30) == "pong"
    finally:
        procs.stop().get(timeout=30)
