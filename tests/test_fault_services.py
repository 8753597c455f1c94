"""The controller's node offers the host agent's services and, once ``this_proc()`` is used,
the actor services too: one service name must not shadow another (real processes).

Found as an order-dependent failure: after any use of ``this_proc()``, a mesh spawned on
``this_host()`` got no MASTER_ADDR/MASTER_PORT (the agent's ``reserve_port`` was replaced by
the actor services' one, which takes a host), so ``init_process_group()`` failed in it."""

from __future__ import annotations

import os

from hpcmesh.actor import Actor, endpoint, this_host, this_proc


class Env(Actor):
    @endpoint
    def master(self) -> tuple:
        return os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")


def test_torchrun_variables_survive_a_this_proc_mesh_in_the_controller():
    first = this_host().spawn_procs(per_host={"gpus": 1})     # the local agent's services
    first.stop().get(timeout=30)
    local = this_proc().spawn("here", Env)          # then the actor services, same node
    assert local.master.call_one().get(timeout=30) is not None
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        got = procs.spawn("env", Env).master.call().get(timeout=60).values()
        addr, port = got[0]
        assert addr and port and port.isdigit(), got
        assert all(g == (addr, port) for g in got), got
    finally:
        procs.stop().get(timeout=30)
