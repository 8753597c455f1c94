"""Runtime configuration under Monarch's names: ``configure``, ``configured``,
``get_runtime_config``, ``get_global_config``, ``clear_runtime_config``.

hpcmesh's settings are environment variables (``HPCMESH_*``, the README's tuning table), read
when the part that needs them starts: the client runtime, a host agent, a process. So
``configure(lease_grace=30)`` is the same as ``HPCMESH_LEASE_GRACE=30`` in the environment from
now on: it holds for what starts after the call (agents and processes inherit it), and
``clear_runtime_config()`` puts the environment back. Values are checked as the variables
are, and a bad one names the key and what it takes.

Monarch's own keys are accepted too, so its programs run unchanged: those with an hpcmesh
counterpart set it (``stop_grace_period="10s"`` is ``stop_grace``); the others are kept in
the runtime layer and have no effect here (logged once each).

(Until 0.x this module was the hosts-file schema: that is ``hpcmesh.hosts_file`` now, and its
names are still importable from here, with a DeprecationWarning.)
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .runtime.observe.stragglers import Settings as StragglerSettings
from .settings import LOG_LEVELS, collective_timeout, env_choice, env_flag, env_number

log = logging.getLogger("hpcmesh.config")

__all__ = ["clear_runtime_config", "configure", "configured", "get_global_config",
           "get_runtime_config"]


@dataclass(frozen=True)
class Key:
    """One setting: its name here, its variable, what it takes, its default."""

    name: str
    var: str
    kind: str                 # "seconds", "number", "flag", "choice", "text"
    default: Any
    choices: tuple[str, ...] = ()
    unit: str = "seconds"
    #: the setting's own reader, for one with bounds of its own (read as its users read it)
    reader: Callable[[Mapping[str, str]], Any] | None = None

    def check(self, value: Any) -> str:
        """The variable's text for ``value``; a ValueError names the key and what it takes."""
        text = self._text(value)
        env = {self.var: text}
        try:
            if self.reader is not None:
                self.reader(env)
            elif self.kind in ("seconds", "number"):
                env_number(self.var, 0, unit=self.unit, finite=True, env=env)
            elif self.kind == "flag":
                env_flag(self.var, False, env=env)
            elif self.kind == "choice":
                env_choice(self.var, self.choices[0], self.choices, env=env)
        except ValueError as e:
            raise ValueError(f"configure({self.name}={value!r}): {e}") from None
        return text

    def _text(self, value: Any) -> str:
        if self.kind == "flag" and isinstance(value, bool):
            return "1" if value else "0"
        if self.kind == "seconds" and isinstance(value, str):
            return str(humantime_seconds(value, self.name))
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            return str(value)
        raise TypeError(f"configure({self.name}=...) takes "
                        f"{'True/False' if self.kind == 'flag' else 'a ' + self.kind}, "
                        f"got {type(value).__name__}")

    def read(self) -> Any:
        """The value in effect now (the environment, else the default)."""
        raw = os.environ.get(self.var)
        if raw is None or raw.strip() == "":
            return self.default
        if self.reader is not None:
            return self.reader(os.environ)
        if self.kind in ("seconds", "number"):
            return env_number(self.var, 0, unit=self.unit, finite=True, env=os.environ)
        if self.kind == "flag":
            return env_flag(self.var, bool(self.default), env=os.environ)
        return raw


KEYS = {k.name: k for k in (
    Key("lease_grace", "HPCMESH_LEASE_GRACE", "seconds", 10.0),
    Key("stop_grace", "HPCMESH_STOP_GRACE", "seconds", 5.0),
    Key("keepalive", "HPCMESH_KEEPALIVE", "seconds", 4.0),
    Key("collective_timeout", "HPCMESH_COLLECTIVE_TIMEOUT", "seconds", 60.0,
        reader=collective_timeout),
    Key("collective_check", "HPCMESH_COLLECTIVE_CHECK", "flag", None),
    Key("fanin_poll_us", "HPCMESH_FANIN_POLL_US", "number", 250.0, unit="microseconds"),
    Key("relay", "HPCMESH_RELAY", "flag", True),
    Key("relay_fold_us", "HPCMESH_RELAY_FOLD_US", "number", 200.0, unit="microseconds"),
    Key("stragglers", "HPCMESH_STRAGGLERS", "flag", True),
    Key("straggler_factor", "HPCMESH_STRAGGLER_FACTOR", "number", 3.0,
        unit="times the median answer time",
        reader=lambda env: StragglerSettings.from_env(env).factor),
    Key("straggler_after_s", "HPCMESH_STRAGGLER_AFTER_S", "seconds", 30.0,
        reader=lambda env: StragglerSettings.from_env(env).after_s),
    Key("hang_after_s", "HPCMESH_HANG_AFTER_S", "seconds", 120.0,
        reader=lambda env: StragglerSettings.from_env(env).hang_s),
    Key("straggler_tick_s", "HPCMESH_STRAGGLER_TICK_S", "seconds", 0.5,
        reader=lambda env: StragglerSettings.from_env(env).tick_s),
    Key("ifname", "HPCMESH_IFNAME", "text", None),
    Key("tls_ca", "HPCMESH_TLS_CA", "text", None),
    Key("zygote", "HPCMESH_ZYGOTE", "flag", True),
    Key("uvloop", "HPCMESH_UVLOOP", "flag", True),
    Key("follow_caller", "HPCMESH_FOLLOW_CALLER", "flag", True),
    Key("malloc_tune", "HPCMESH_MALLOC_TUNE", "flag", True),
    Key("malloc_arenas", "HPCMESH_MALLOC_ARENAS", "number", None, unit="malloc arenas"),
    Key("log_level", "HPCMESH_LOG_LEVEL", "choice", "WARNING", LOG_LEVELS),
    Key("gpu_binding", "HPCMESH_GPU_BINDING", "choice", "host", ("host", "process")),
)}

#: Monarch keys that mean an hpcmesh setting.
MONARCH_ALIASES = {"stop_grace_period": "stop_grace", "mesh_orphan_timeout": "lease_grace"}

#: Monarch 0.7 keys with no counterpart here: accepted (programs that set them run), kept in
#: the runtime layer, no effect.
MONARCH_ONLY = frozenset("""
default_transport enable_log_forwarding enable_file_capture tail_log_lines
codec_max_frame_length message_delivery_timeout host_spawn_ready_timeout
mesh_proc_spawn_max_idle process_exit_timeout message_ack_time_interval
message_ack_every_n_messages message_ttl_default split_max_buffer_size split_max_buffer_age
stop_actor_timeout cleanup_timeout default_encoding channel_net_rx_buffer_full_check_interval
channel_tcp_congestion message_latency_sampling_rate enable_dest_actor_reordering_buffer
mesh_bootstrap_enable_pdeathsig mesh_terminate_concurrency mesh_terminate_timeout
small_write_threshold max_cast_dimension_size remote_alloc_bind_to_inaddr_any
remote_alloc_bootstrap_addr remote_alloc_allowed_port_range read_log_buffer force_file_log
prefix_with_rank actor_spawn_max_idle get_actor_state_max_idle supervision_watchdog_timeout
proc_stop_max_idle get_proc_state_max_idle mesh_admin_addr mesh_attach_config_timeout
pyspy_bin rdma_allow_tcp_fallback rdma_disable_ibverbs rdma_max_chunk_size_mb
rdma_ibverbs_target rdma_peer_device_affinity rdma_max_nics_per_buffer
rdma_min_stripe_size_kb rdma_qps_per_cq rdma_cq_poller_per_device rdma_runtime_worker_threads
""".split())

_lock = threading.RLock()
_layer: dict[str, Any] = {}              # what configure() set, by the name it was given
_saved_env: dict[str, str | None] = {}   # each variable configure() changed, as it was before
_told: set[str] = set()

_HUMANTIME = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|us|ns|s|m|min|h|d)?", re.IGNORECASE)
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0,
           "h": 3600.0, "d": 86400.0}


def humantime_seconds(text: str, key: str = "value") -> float:
    """``"30s"``, ``"5m"``, ``"1h 30m"``, ``"500ms"`` (Monarch's durations) in seconds."""
    parts = text.strip().split()
    total, ok = 0.0, bool(parts)
    for part in parts:
        m = _HUMANTIME.fullmatch(part)
        if m is None:
            ok = False
            break
        total += float(m.group(1)) * _UNIT_S[(m.group(2) or "").lower() or None]
    if not ok or not math.isfinite(total):
        raise ValueError(f"configure({key}={text!r}): a duration looks like 30s, 5m, "
                         f"1h 30m or 500ms")
    return total


def _key_for(name: str) -> Key | None:
    key = KEYS.get(MONARCH_ALIASES.get(name, name))
    if key is None and name not in MONARCH_ONLY:
        raise TypeError(f"configure() got an unknown key {name!r}; hpcmesh's keys: "
                        f"{', '.join(sorted(KEYS))} (and Monarch's, which it accepts)")
    return key


def configure(**kwargs: Any) -> None:
    """Set runtime configuration for this process and what it starts from now on."""
    with _lock:
        checked = {}
        for name, value in kwargs.items():       # all checked before any is applied
            key = _key_for(name)
            checked[name] = (key, key.check(value) if key is not None else None)
        for name, (key, text) in checked.items():
            _layer[name] = kwargs[name]
            if key is None:
                if name not in _told:
                    _told.add(name)
                    log.info("configure(%s=...): a Monarch setting with no counterpart in "
                             "hpcmesh; kept, no effect", name)
                continue
            _saved_env.setdefault(key.var, os.environ.get(key.var))
            os.environ[key.var] = text


def get_runtime_config() -> dict[str, Any]:
    """What ``configure`` set (the runtime layer), by the names it was given."""
    with _lock:
        return dict(_layer)


def get_global_config() -> dict[str, Any]:
    """Every hpcmesh key's value in effect (environment, else default), plus the Monarch
    keys set through ``configure``."""
    with _lock:
        merged = {name: key.read() for name, key in KEYS.items()}
        merged.update({k: v for k, v in _layer.items() if k in MONARCH_ONLY})
        return merged


def clear_runtime_config() -> None:
    """Forget what ``configure`` set: every variable it changed is as it was before."""
    with _lock:
        for var, old in _saved_env.items():
            if old is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = old
        _saved_env.clear()
        _layer.clear()


@contextlib.contextmanager
def configured(**overrides: Any) -> Iterator[dict[str, Any]]:
    """``configure(**overrides)`` for a ``with`` block, then the previous configuration
    again; yields ``get_global_config()``."""
    with _lock:
        before = get_runtime_config()
    configure(**overrides)
    try:
        yield get_global_config()
    finally:
        clear_runtime_config()
        configure(**before)


def __getattr__(name: str) -> Any:
    """The hosts-file names this module used to hold, for one more release."""
    from . import hosts_file
    if name in hosts_file.__all__ or name == "SCHEDULER_KEYS":
        warnings.warn(f"hpcmesh.config.{name} moved to hpcmesh.hosts_file.{name} (hpcmesh.config "
                      f"is Monarch's runtime configuration now); the old name goes in the "
                      f"next release", DeprecationWarning, stacklevel=2)
        return getattr(hosts_file, name)
    if name in ("parse_worker_address", "WORKER_SCHEMES"):     # the worker-URL rule's home now
        from .transport import addresses
        warnings.warn(f"hpcmesh.config.{name} moved to hpcmesh.transport.addresses.{name}; the "
                      f"old name goes in the next release", DeprecationWarning, stacklevel=2)
        return getattr(addresses, name)
    raise AttributeError(f"module 'hpcmesh.config' has no attribute {name!r}")
