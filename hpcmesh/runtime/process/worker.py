"""Monarch's entry point for a worker host: ``run_worker_loop_forever`` (``monarch.actor``).

A thin name over :func:`hpcmesh.runtime.process.agent_main.run_agent`, the one entry point every
launcher uses; what the agent does while it runs is :mod:`hpcmesh.runtime.process.agent_serve`.
"""

from __future__ import annotations


def run_worker_loop_forever(address: str | list[str] = "tcp://0.0.0.0:0", *,
                            attach: list[str] = (), secret: bytes | None = None,
                            grace: float | None = None, initial_wait: float | None = None,
                            advertise_host: str | None = None, ready_file: str | None = None,
                            ca=None) -> str:
    """Run a host agent until its lease expires or a stop signal comes; returns why it
    stopped. Monarch's name for :func:`hpcmesh.runtime.process.agent_main.run_agent`."""
    # imported here: ``hpcmesh.actor`` hands this function out, and a program that only
    # drives meshes should not load the agent's entry point (signals, notices, json)
    from .agent_main import run_agent
    return run_agent(address, attach, secret, grace=grace, initial_wait=initial_wait,
                     advertise_host=advertise_host, ready_file=ready_file, ca=ca)


def run_worker_loop_until_shutdown(address: str | list[str] = "tcp://0.0.0.0:0", *,
                                   attach: list[str] = (), secret: bytes | None = None,
                                   grace: float | None = None,
                                   initial_wait: float | None = None,
                                   advertise_host: str | None = None,
                                   ready_file: str | None = None, ca=None) -> str:
    """Monarch's variant that returns once the ``HostMesh`` owning this host shuts it down
    (``HostMesh.shutdown()``). An hpcmesh agent always returns when it ends (shut down,
    a stop signal, or its lease: a lost controller never leaves it running), so this is
    ``run_worker_loop_forever``; it returns why the agent stopped."""
    return run_worker_loop_forever(address, attach=attach, secret=secret, grace=grace,
                                   initial_wait=initial_wait, advertise_host=advertise_host,
                                   ready_file=ready_file, ca=ca)
