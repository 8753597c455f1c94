"""``TelemetryConfig`` (Monarch's fields and defaults): light, so that ``hpcmesh.job`` can
name it without loading pyarrow or DataFusion until a job turns telemetry on."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class TelemetryConfig:
    """``retention_secs``: how long rows are kept; ``include_dashboard``: also serve the
    web dashboard (``state().dashboard_url``) on ``dashboard_port`` (0: any free port; a
    port in use falls back to a free one, with a warning); ``snapshot_interval_secs``: how
    often every process's stacks are recorded (``stack_snapshots``) and the store is
    saved for a reconnecting client (0: never)."""
    retention_secs: float = 3600
    include_dashboard: bool = False
    dashboard_port: int = 8265
    snapshot_interval_secs: float = 30.0

    def check(self) -> "TelemetryConfig":
        """Refuse values that mean nothing, naming the field and what is allowed."""
        def number(name: str, minimum: float, positive: bool = False) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < minimum or (positive and v <= 0):
                bound = "> 0" if positive else f">= {minimum:g}"
                raise ValueError(f"TelemetryConfig.{name} must be a finite number {bound}, "
                                 f"got {v!r}")
        number("retention_secs", 0, positive=True)
        number("snapshot_interval_secs", 0)
        if not isinstance(self.include_dashboard, bool):
            raise TypeError(f"TelemetryConfig.include_dashboard must be True or False, got "
                            f"{self.include_dashboard!r}")
        p = self.dashboard_port
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 65535:
            raise ValueError(f"TelemetryConfig.dashboard_port must be a port number 0-65535 "
                             f"(0: any free port), got {p!r}")
        return self
