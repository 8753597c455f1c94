"""``runtime/observe/nvidia_smi``, the one GPU probe (telemetry samples, ``hpcmesh info``):
against a fake ``nvidia-smi`` on PATH, no GPU needed."""

import os
import stat

import pytest

from hpcmesh.runtime.observe import nvidia_smi
from hpcmesh.runtime.observe.telemetry_recorder import sample_gpus

ROWS = ("0, GPU-1f2e, NVIDIA H200, 37, 1024, 143771\n"
        "1, GPU-aa00, NVIDIA H200, [N/A], 0, [Not Supported]\n")


def fake_smi(tmp_path, monkeypatch, body: str) -> None:
    """Put an ``nvidia-smi`` running the shell ``body`` first on PATH."""
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_rows_are_parsed_and_unreadable_fields_are_none(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, f"printf '{ROWS}not a gpu row\\n'")
    gpus = nvidia_smi.query_gpus(timeout=10)
    assert gpus[0] == {"gpu": 0, "uuid": "GPU-1f2e", "name": "NVIDIA H200",
                       "utilization_percent": 37.0, "memory_used_bytes": 1024 * 2**20,
                       "memory_total_bytes": 143771 * 2**20}
    assert gpus[1]["utilization_percent"] is None and gpus[1]["memory_total_bytes"] is None
    assert len(gpus) == 2
    assert sample_gpus() == gpus                    # telemetry's sample is the same probe


def test_a_failing_or_hanging_nvidia_smi_is_an_error_naming_why(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, "echo 'NVIDIA-SMI has failed: no driver' >&2; exit 9")
    with pytest.raises(nvidia_smi.NvidiaSmiError, match="status 9: NVIDIA-SMI has failed"):
        nvidia_smi.query_gpus(timeout=10)
    assert sample_gpus() == []                      # telemetry skips the sample
    fake_smi(tmp_path, monkeypatch, "exec sleep 30")
    with pytest.raises(nvidia_smi.NvidiaSmiError, match="did not answer within 0.2s"):
        nvidia_smi.query_gpus(timeout=0.2)


def test_no_nvidia_smi_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))       # an empty folder
    assert nvidia_smi.query_gpus(timeout=10) is None
    assert sample_gpus() == []
