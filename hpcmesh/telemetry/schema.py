"""The telemetry tables: their columns, types and meaning (pure data, no pyarrow here).

Names follow Monarch's telemetry where it has them (``meshes``, ``actors``,
``actor_status_events``, ``messages``, ``sent_messages``, ``events``, ``spans``,
``metric_*``; ``timestamp_us``, ``new_status``, ``actor_mesh_id``, ``view_json``,
``shape_json``...).
Each table lists the columns a process records (``RECORDED``, in the order of the row
tuples of ``hpcmesh.runtime.observe.telemetry_recorder``) and those the collector adds per process
(``process``, ``host``, ``pid``: who recorded the row). ``docs/TELEMETRY.md`` prints this
file as the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Added to the rows of the tables that say so, by the collector, per drained process.
SOURCE_COLUMNS = (("process", "string", "the process that recorded the row (\"client\": "
                                        "the controller)"),
                  ("host", "string", "its host"),
                  ("pid", "int64", "its pid"))


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[tuple[str, str, str], ...]     # (name, arrow type, meaning)
    from_source: bool = True       # the collector appends SOURCE_COLUMNS

    @property
    def all_columns(self) -> tuple[tuple[str, str, str], ...]:
        return self.columns + (SOURCE_COLUMNS if self.from_source else ())

    @property
    def column_names(self) -> list[str]:
        return [c[0] for c in self.all_columns]


TS = ("timestamp_us", "int64", "when, in microseconds since the Unix epoch (wall clock)")
#: SPEC §12: what kind of failure it was, so that a user can tell their bug from the cluster's
FAILURE_CLASS = ("failure_class", "string",
                 "the failure's class: user exception, out of memory, host lost, ended by Slurm, "
                 "signal or collective timeout; for a process stopped because its host agent "
                 "or its job ended, why (agent exited, ended by Slurm); None otherwise")

TABLES: dict[str, Table] = {t.name: t for t in (
    Table("meshes", "one row per mesh created: proc meshes and actor meshes", (
        TS,
        ("id", "string", "the mesh's id (an actor mesh's id is its actors' actor_mesh_id)"),
        ("kind", "string", "proc or actor"),
        ("class", "string", "the actor class (ProcMesh for a proc mesh)"),
        ("given_name", "string", "the name given at spawn"),
        ("shape_json", "string", "its extent as JSON, e.g. {\"hosts\": 2, \"gpus\": 4}"),
        ("parent_mesh_id", "string", "the mesh it was spawned on (a proc mesh's host mesh "
                                     "name; an actor mesh's proc mesh)"))),
    Table("actors", "one row per actor started (recorded by the process that spawned it, "
          "once the spawn succeeded)", (
        TS,
        ("id", "string", "<actor_mesh_id>.<rank>: what the other tables call actor_id"),
        ("mesh_id", "string", "its actor mesh (meshes.id)"),
        ("rank", "int64", "its rank in that mesh"),
        ("full_name", "string", "<mesh name>[<rank>]"),
        ("process", "string", "the process it runs in"),
        ("host", "string", "that process's host"),
        ("pid", "int64", "its pid")), from_source=False),
    Table("actor_status_events", "status changes of actors: spawned, failed, stopped, "
          "with the reason (a failure's message; a killed process's signal)", (
        TS,
        ("actor_id", "string", "actors.id"),
        ("new_status", "string", "spawned, failed or stopped"),
        ("reason", "string", "why (None for spawned)"),
        FAILURE_CLASS)),
    Table("process_status_events", "status changes of processes, as the controller sees "
          "them: running (connected), stopped, failed (with its exit status or signal)", (
        TS,
        ("process", "string", "the process's name"),
        ("mesh", "string", "its proc mesh"),
        ("label", "string", "its point, as in log prefixes (hosts=0,gpus=1)"),
        ("host", "string", "its host"),
        ("pid", "int64", "its pid"),
        ("new_status", "string", "running, stopped or failed"),
        ("reason", "string", "how it ended"),
        FAILURE_CLASS), from_source=False),
    Table("job_events", "the job itself moved (SPEC §12): Slurm requeued, preempted, "
          "timed out, cancelled or ended it, or it runs again after a requeue; its processes' "
          "ends are then this one row, not a failure each", (
        TS,
        ("kind", "string", "requeued, preempted, time_limit, cancelled, ended or "
                           "running-again"),
        ("job_id", "string", "the Slurm job"),
        ("restart", "int64", "which run of the job (Slurm's restart count) it is about"),
        ("reason", "string", "what Slurm said: state, reason, restart count")),
          from_source=False),
    Table("messages", "one row per call an actor handled (the receiving side)", (
        TS,
        ("to_actor_id", "string", "the actor that handled it (actors.id)"),
        ("endpoint", "string", "the endpoint's name"),
        ("caller", "string", "the calling process (\"client\": the controller)"),
        ("duration_us", "int64", "from when the actor took the call up (a call that waited in "
                                 "its mailbox: when the one before it ended) to its reply, in "
                                 "microseconds"),
        ("status", "string", "ok, or error (it raised, or its result could not be sent)"),
        ("bytes", "int64", "about how many bytes the call took on the wire (a call that "
                   "came in a batch frame: its share of the frame)"))),
    Table("sent_messages", "one row per call made to an actor mesh (the sending side; a "
          "call to N actors is one row)", (
        ("timestamp_us", "int64", "when the call went out, in microseconds since the Unix "
                                  "epoch (wall clock): the time of the first write to a "
                                  "socket after the call (its frame's, or an earlier one's)"),
        ("sender", "string", "the calling process"),
        ("actor_mesh_id", "string", "the mesh called (meshes.id)"),
        ("endpoint", "string", "the endpoint's name"),
        ("method", "string", "call_one, call, broadcast, choose, stream or send"),
        ("view_json", "string", "the extent of the view called, as JSON"),
        ("n_dest", "int64", "how many actors it went to"))),
    Table("events", "log lines of the processes (forwarded stdout/stderr) and other facts", (
        TS,
        ("level", "string", "stdout, stderr, or a logging level"),
        ("source", "string", "the process the line came from"),
        ("message", "string", "the line"))),
    Table("spans", "one row per span that ended: a named, timed section of code "
          "(hpcmesh.telemetry.span) or a coarse runtime operation (hpcmesh.spawn_procs, "
          "hpcmesh.spawn_actors, hpcmesh.stop, hpcmesh.stop_actors)", (
        ("timestamp_us", "int64", "when it started, in microseconds since the Unix epoch "
                                  "(wall clock)"),
        ("span_id", "string", "<pid>-<8 hex digits drawn per process>-<n>: unique in the job"),
        ("parent_span_id", "string", "the span open in the same asyncio task or thread when "
                                     "it started (None at the top)"),
        ("name", "string", "the name given (without one: the decorated function's "
                           "qualified name, or that of the function the with is in)"),
        ("duration_us", "int64", "from its start to its end, in microseconds (monotonic "
                                 "clock)"),
        ("status", "string", "ok, or error (an exception ended it)"),
        ("error", "string", "that exception's type and message (None when ok)"),
        ("actor_id", "string", "the actor it ran in (actors.id; None outside actors)"),
        ("endpoint", "string", "the endpoint of that actor it ran in (None outside one)"),
        ("attributes_json", "string", "its keyword attributes as JSON (a value JSON cannot "
                                      "hold: its repr)"))),
    Table("metric_process", "a sample of each process per collection (about once a second)", (
        TS,
        ("cpu_percent", "double", "CPU since the previous sample, in percent of one core"),
        ("rss_bytes", "int64", "resident memory"),
        ("threads", "int64", "threads"))),
    Table("metric_gpu", "a sample of each host's GPUs per collection (nvidia-smi, where "
          "present), from its host agent", (
        TS,
        ("gpu", "int64", "the GPU's index on its host"),
        ("uuid", "string", "its UUID"),
        ("name", "string", "its model"),
        ("utilization_percent", "double", "GPU utilisation"),
        ("memory_used_bytes", "int64", "memory in use"),
        ("memory_total_bytes", "int64", "memory in all"))),
    Table("stack_snapshots", "every snapshot_interval_secs, each process's Python threads "
          "(hpcmesh's own stack service, as the admin view; Monarch takes py-spy dumps)", (
        TS,
        ("thread", "string", "the thread's name"),
        ("stack", "string", "its stack, innermost frame last"))),
    Table("stragglers", "one row per member of a call() named late by the controller "
          "(runtime/observe/stragglers.py): a straggler (others answered; it has not after "
          "HPCMESH_STRAGGLER_FACTOR x their median answer time and at least "
          "HPCMESH_STRAGGLER_AFTER_S) or a hang (no member answered after "
          "HPCMESH_HANG_AFTER_S; a call_one or choose() not answered after it is a hang "
          "too); members with the same stack share a group", (
        TS,
        ("report_id", "int64", "the report (one per call; its rows share it)"),
        ("kind", "string", "straggler or hang; finished: the report's call finished "
                           "(one row, waited_s: when, the member columns empty)"),
        ("actor_mesh_id", "string", "the mesh called (meshes.id)"),
        ("mesh", "string", "its name"),
        ("endpoint", "string", "the endpoint called"),
        ("point", "string", "the late member's process's point (hosts=0,gpus=3)"),
        ("process", "string", "that process"),
        ("host", "string", "its host"),
        ("pid", "int64", "its pid"),
        ("waited_s", "double", "how long the call had waited for it when it was named"),
        ("stack_group", "int64", "its stack's group in the report (0: the biggest)"),
        ("group_size", "int64", "how many late members share that stack"),
        ("headline", "string", "the group's stack in a line: what the innermost user frame "
                               "calls, and where"),
        ("stack", "string", "the group's stacks (threads running user code), innermost "
                            "frame last"),
        ("source", "string", "where the stack came from: event loop, py-spy or "
                             "faulthandler (empty: none)")), from_source=False),
    Table("telemetry_drops", "rows a process could not keep (its buffer was full between "
          "two collections, or the store's cap was reached)", (
        TS,
        ("table_name", "string", "the table they were for"),
        ("dropped", "int64", "how many"))),
)}


def reference_markdown() -> str:
    """The schema as Markdown (docs/TELEMETRY.md's reference section)."""
    out = []
    for t in TABLES.values():
        out.append(f"### `{t.name}`\n\n{t.doc[0].upper()}{t.doc[1:]}.\n\n| column | type | "
                   f"meaning |\n|---|---|---|")
        out += [f"| `{n}` | {ty} | {doc} |" for n, ty, doc in t.all_columns]
        out.append("")
    return "\n".join(out)
