"""Monarch's actor prefix on ``logging`` records: a record made inside an actor's endpoint
or constructor says which actor made it, ``[actor=<module.Class mesh{point}>] message``,
while ``hpcmesh.actor.config.prefix_python_logs_with_actor`` is true (Monarch 0.7's format
and switch). The lines an actor prints are not touched: the forwarding to the controller
puts the process's point before each line (``[gpus=1] ...``), as it always has.

Monarch adds its prefix through a filter on every handler (patching
``Logger.addHandler``); here a log record factory adds it, once per record, whatever
handlers the program installs, and without patching ``logging``."""

from __future__ import annotations

import logging

from ..runtime.context import current_context_var
from . import config

_installed = False


def install_actor_log_prefix() -> None:
    """Wrap the process's log record factory once (idempotent): the records of code that
    runs as an actor get the actor's prefix."""
    global _installed
    if _installed:
        return
    _installed = True
    make_record = logging.getLogRecordFactory()

    def with_actor_prefix(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        ctx = current_context_var.get()
        # an actor's context only (the client has none); an empty message is left alone,
        # as Monarch does (torch.compile's structured logs need it empty)
        if ctx is not None and config.prefix_python_logs_with_actor:
            prefix = f"[actor={ctx.actor_instance}] "
            record.actor_prefix = prefix
            if record.msg:
                record.msg = f"{prefix}{record.msg}"
        return record
    logging.setLogRecordFactory(with_actor_prefix)
