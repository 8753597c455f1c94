"""Monarch's ``[actor=...]`` prefix on the logging records of actors, switched by
``hpcmesh.actor.config.prefix_python_logs_with_actor`` (issue 32 item 9)."""

from __future__ import annotations

import io
import logging

from hpcmesh.actor import Actor, config, context, endpoint, this_host


class Talker(Actor):
    """Logs through a handler of its own, and hands back what it wrote."""

    def __init__(self):
        self.out = io.StringIO()
        handler = logging.StreamHandler(self.out)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.log = logging.getLogger("prefix_test")
        self.log.addHandler(handler)
        self.log.warning("from __init__")

    @endpoint
    def talk(self, word: str) -> list[str]:
        self.log.warning("said %s", word)
        lines = self.out.getvalue().splitlines()
        self.out.seek(0)
        self.out.truncate()
        return lines

    @endpoint
    def prefix(self, on: bool) -> None:
        config.prefix_python_logs_with_actor = on

    @endpoint
    def me(self) -> str:
        return str(context().actor_instance)


def test_actor_records_carry_the_actor_and_the_switch_turns_it_off():
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        talkers = procs.spawn("talkers", Talker)
        me = talkers.me.call().get(timeout=30)
        assert me.item(gpus=1) == f"<{Talker.__module__}.Talker talkers{{'gpus': 1/2}}>"
        lines = talkers.talk.call("hello").get(timeout=30).item(gpus=1)
        assert lines == [f"WARNING prefix_test: [actor={me.item(gpus=1)}] from __init__",
                         f"WARNING prefix_test: [actor={me.item(gpus=1)}] said hello"]
        talkers.prefix.call(False).get(timeout=30)
        assert talkers.talk.call("plain").get(timeout=30).item(gpus=0) == [
            "WARNING prefix_test: said plain"]
    finally:
        procs.stop().get(timeout=30)


def test_the_clients_records_are_left_alone():
    """The client is no actor: its records keep their message (Monarch 0.7 prefixes them
    ``[actor=<root>]`` once its runtime is up)."""
    assert str(context().actor_instance) == "<root>"
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    log = logging.getLogger("prefix_test_client")
    log.addHandler(handler)
    try:
        log.warning("from the client")
    finally:
        log.removeHandler(handler)
    assert out.getvalue() == "from the client\n"
