"""hpcmesh.config: Monarch's runtime configuration names over hpcmesh's HPCMESH_* settings."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from hpcmesh import config


@pytest.fixture(autouse=True)
def clean():
    config.clear_runtime_config()
    yield
    config.clear_runtime_config()


def test_configure_sets_the_variable_and_clear_puts_it_back(monkeypatch):
    monkeypatch.setenv("HPCMESH_LEASE_GRACE", "12")
    config.configure(lease_grace=30, zygote=False, log_level="info")
    assert os.environ["HPCMESH_LEASE_GRACE"] == "30"
    assert os.environ["HPCMESH_ZYGOTE"] == "0" and os.environ["HPCMESH_LOG_LEVEL"] == "info"
    assert config.get_runtime_config() == {"lease_grace": 30, "zygote": False,
                                           "log_level": "info"}
    merged = config.get_global_config()
    assert merged["lease_grace"] == 30.0 and merged["zygote"] is False
    assert merged["stop_grace"] == 5.0                    # unset: the default
    config.clear_runtime_config()
    assert os.environ["HPCMESH_LEASE_GRACE"] == "12" and "HPCMESH_ZYGOTE" not in os.environ
    assert config.get_runtime_config() == {}


def test_monarch_keys_and_durations():
    config.configure(stop_grace_period="1m 30s", enable_log_forwarding=False,
                     mesh_orphan_timeout="500ms")
    assert os.environ["HPCMESH_STOP_GRACE"] == "90.0"
    assert os.environ["HPCMESH_LEASE_GRACE"] == "0.5"
    assert config.get_runtime_config()["enable_log_forwarding"] is False
    assert config.get_global_config()["enable_log_forwarding"] is False


def test_configured_restores_what_was_there():
    config.configure(collective_timeout=20)
    with config.configured(collective_timeout=5, gpu_binding="process") as merged:
        assert merged["collective_timeout"] == 5.0 and merged["gpu_binding"] == "process"
        assert os.environ["HPCMESH_GPU_BINDING"] == "process"
    assert os.environ["HPCMESH_COLLECTIVE_TIMEOUT"] == "20"
    assert "HPCMESH_GPU_BINDING" not in os.environ
    assert config.get_runtime_config() == {"collective_timeout": 20}


def test_bad_keys_and_values_name_what_is_wrong():
    with pytest.raises(TypeError, match=r"unknown key 'leese_grace'.*lease_grace"):
        config.configure(leese_grace=3)
    with pytest.raises(ValueError, match=r"configure\(lease_grace=inf\).*finite"):
        config.configure(lease_grace=float("inf"))
    with pytest.raises(ValueError, match=r"configure\(gpu_binding='pinned'\).*host, process"):
        config.configure(gpu_binding="pinned")
    with pytest.raises(ValueError, match=r"duration looks like 30s"):
        config.configure(stop_grace_period="soon")
    with pytest.raises(TypeError, match=r"zygote=.*True/False"):
        config.configure(zygote=[1])
    # nothing of a refused call is applied, not even its good keys
    with pytest.raises(TypeError):
        config.configure(stop_grace=3, nope=1)
    assert "HPCMESH_STOP_GRACE" not in os.environ and config.get_runtime_config() == {}


def test_processes_started_after_configure_see_it():
    code = ("from hpcmesh import config\n"
            "from hpcmesh.actor import Actor, endpoint, this_host\n"
            "import os\n"
            "class E(Actor):\n"
            "    @endpoint\n"
            "    def grace(self): return os.environ.get('HPCMESH_LEASE_GRACE')\n"
            "config.configure(lease_grace=17)\n"
            "p = this_host().spawn_procs()\n"
            "print(p.spawn('e', E).grace.call_one().get())\n"
            "p.stop().get()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) == 17.0      # the runtime passes it on to its processes


def test_the_old_hosts_file_names_still_import_with_a_warning():
    from hpcmesh import hosts_file
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from hpcmesh.config import ConfigError, load_hosts_config
    assert ConfigError is hosts_file.ConfigError and load_hosts_config is hosts_file.load_hosts_config
    assert [w.category for w in caught] == [DeprecationWarning, DeprecationWarning]
    assert "hpcmesh.hosts_file.ConfigError" in str(caught[0].message)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        config.nothing


@pytest.mark.parametrize("value", [0, -1, float("nan"), 10**9])
def test_configure_checks_the_collective_timeout_as_the_collectives_read_it(value):
    """0 passed the generic seconds check and then failed every collective (issue 28)."""
    with pytest.raises(ValueError) as e:
        config.configure(collective_timeout=value)
    assert str(e.value) == (f"configure(collective_timeout={value!r}): HPCMESH_COLLECTIVE_TIMEOUT "
                            f"must be a number of seconds > 0 and at most 31536000, not "
                            f"{str(value)!r}")
    assert "HPCMESH_COLLECTIVE_TIMEOUT" not in config.get_runtime_config()
