"""Jobs a scheduler may end as a whole (SPEC §12): which host agents are one job's, and,
before what happens on one of them unasked is reported, the question whether the job
itself moved (requeued, preempted, ended), asked once for the whole job.

The client runtime holds one :class:`JobEnds` and asks it (``held``) before it reports a
process's exit or an agent's exit or loss; what it does when a job moved (every process on
its agents ends with it) it gives as a callback. Nothing here touches a process.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

from .errors import SupervisionError
from .node import Node

log = logging.getLogger("hpcmesh.client")


@dataclass(eq=False)
class JobAgents:
    """The host agents of one job that its scheduler may end, requeue or preempt as a
    whole (``JobEnds.watch``), and what is known of that so far."""
    agent_ids: frozenset
    explain: Callable[[str], "SupervisionError | None"]
    held: list = field(default_factory=list)    # what to report if the job did not move
    asking: bool = False
    ended: SupervisionError | None = None       # the job moved: why, in its words


class JobEnds:
    """A client runtime's watched jobs, by host agent id (kept on the node's loop).

    ``end_processes(agent_ids, error, reword)`` (on the loop): every process on those
    agents ended with their job, in ``error``'s words (``reword``: those that did already
    take the newer words); ``closing()``: the runtime is shutting down, so nothing is held."""

    def __init__(self, node: Node,
                 end_processes: Callable[[frozenset, SupervisionError, bool], None],
                 closing: Callable[[], bool]):
        self.node = node
        self._end_processes = end_processes
        self._closing = closing
        self._groups: dict[str, JobAgents] = {}     # host agent node id -> its job

    def watch(self, agent_ids, explain: Callable[[str], SupervisionError | None]
              ) -> Callable[[], None]:
        """These host agents are one job's, which its scheduler may end, requeue or preempt
        as a whole. When one of them, or a process on one, ends unasked, ``explain(what)``
        is asked before anything is reported, on a thread of its own (it may ask the
        scheduler, and should answer within a second or two): a SupervisionError back means
        the job itself moved, and every process on these agents ends with it
        (:meth:`end`), no fault reported; None means it did not, and what happened is
        reported as it would have been. Calls pending on a process that ended wait for that
        answer. Returns the undo. From any thread."""
        group = JobAgents(frozenset(agent_ids), explain)

        def add() -> None:
            for agent_id in group.agent_ids:
                self._groups[agent_id] = group

        def remove() -> None:
            for agent_id in group.agent_ids:
                if self._groups.get(agent_id) is group:
                    del self._groups[agent_id]
        self.node.call_soon(add)
        return lambda: self.node.call_soon(remove)

    def end(self, agent_ids, error: SupervisionError) -> None:
        """The job of these agents ended, was requeued or preempted: every process on them
        is gone with it, on purpose as far as supervision goes (no MeshFailure), and calls
        to them fail now, later ones at once, with ``error``'s words. Again with newer
        words (the job's final state, once Slurm has it), it rewords what they raise. From
        any thread."""
        self.node.call_soon(self._end, frozenset(agent_ids), error, True)

    def held(self, agent_id: str, what: str, report: Callable[[], None]) -> bool:
        """(loop) ``report`` is what the runtime would do about ``what``, which happened on
        ``agent_id``. On a watched job's agent it waits for the job's answer (True)."""
        group = self._groups.get(agent_id)
        if group is None or self._closing():
            return False
        if group.ended is not None:
            self._end(group.agent_ids, group.ended)
            return True
        group.held.append(report)
        if not group.asking:
            group.asking = True
            threading.Thread(target=self._ask, args=(group, what), daemon=True,
                             name="hpcmesh-job-ends").start()
        return True

    def notice(self, agent_id: str, what: str) -> None:
        """(loop) A watched job's agent got a notice and goes on (``what``: SIGTERM in a
        Slurm step): the job is asked whether it moved, nothing held (there is nothing to
        report if it did not). An ask in flight answers for this notice too."""
        group = self._groups.get(agent_id)
        if group is not None and not group.asking and group.ended is None:
            self.held(agent_id, what, lambda: None)

    def _ask(self, group: JobAgents, what: str) -> None:
        try:
            verdict = group.explain(what)
        except Exception:  # noqa: BLE001 - cannot tell: report it as a fault, as before
            log.exception("could not tell whether the job moved (%s)", what)
            verdict = None
        self.node.call_soon(self._verdict, group, verdict)

    def _verdict(self, group: JobAgents, verdict: SupervisionError | None) -> None:
        held, group.held, group.asking = group.held, [], False
        if verdict is None:
            for report in held:
                report()
            return
        group.ended = verdict
        self._end(group.agent_ids, verdict)
        # the agents of the run that ended may still live (a notice of its end came, and
        # they go on until Slurm's SIGKILL): nothing is left for them to serve
        for agent_id in group.agent_ids:
            if self.node.peer_connected(agent_id):
                self.node.rpc(self.node.ref_of(agent_id), "shutdown_agent")

    def _end(self, agent_ids: frozenset, error: SupervisionError, reword: bool = False) -> None:
        """(loop) :meth:`end`; ``reword``: those that ended with the job already get
        ``error``'s words too."""
        self._end_processes(agent_ids, error, reword)
        for agent_id in agent_ids:
            group = self._groups.get(agent_id)
            if group is not None:
                group.ended = error     # what happens on its agents later is this too
