"""Hosts-file schema: every error names file:line, the key/value and what is allowed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hpcmesh.hosts_file import (
    SCHEDULERS,
    ConfigError,
    HostsFileError,
    HostsConfig,
    HostListError,
    expand_hosts,
    load_hosts_config,
    parse_hosts_config,
)
from hpcmesh.yaml_lines import SchemaError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def parse(text: str, source: str = "hosts.yaml") -> HostsConfig:
    return parse_hosts_config(textwrap.dedent(text), source)


def error(text: str, source: str = "hosts.yaml") -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        parse(text, source)
    assert isinstance(exc.value, ValueError)
    return exc.value


# ----------------------------------------------------------------- examples


@pytest.mark.parametrize("name", ["local", "slurm", "ssh", "static"])
def test_example_files_parse(name):
    path = CONFIGS / f"{name}.yaml"
    cfg = load_hosts_config(path)
    assert cfg.scheduler == name
    assert cfg.path == str(path)


def test_example_contents():
    local = load_hosts_config(CONFIGS / "local.yaml")
    assert local.processes_per_host == 4
    slurm = load_hosts_config(CONFIGS / "slurm.yaml")
    assert isinstance(slurm.job, dict) and slurm.job["nodes"] == 4
    assert slurm.job["time"] == "02:00:00"
    assert slurm.srun_args == ["--cpu-bind=none"]
    assert slurm.network_ifname == "ib0"
    ssh = load_hosts_config(CONFIGS / "ssh.yaml")
    assert ssh.hosts == ["node01", "node02", "node03", "node04", "gpu-a1", "gpu-a2"]
    assert ssh.ssh_args[:2] == ["-o", "BatchMode=yes"]
    assert ssh.network_ifname == "10.77.0.0/16"
    assert ssh.tls is True and ssh.tls_ca == "trust_all_connections"
    static = load_hosts_config(CONFIGS / "static.yaml")
    assert static.workers[0] == "tcp://10.0.0.5:26600"
    assert static.workers[-1].startswith("unix:///")


# ----------------------------------------------------------------- loading


def test_load_unset_variable_returns_none():
    assert load_hosts_config(None, env={}) is None
    assert load_hosts_config(None, env={"HPCMESH_HOSTS": ""}) is None
    assert load_hosts_config(None, var="OTHER", env={"HPCMESH_HOSTS": "x"}) is None


def test_load_from_variable(tmp_path):
    f = tmp_path / "hosts.yaml"
    f.write_text("scheduler: local\n")
    cfg = load_hosts_config(None, env={"HPCMESH_HOSTS": str(f)})
    assert cfg.scheduler == "local" and cfg.path == str(f)
    cfg = load_hosts_config(None, var="MY_HOSTS", env={"MY_HOSTS": str(f)})
    assert cfg.scheduler == "local"


def test_load_missing_file_names_variable(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=rf"HPCMESH_HOSTS={missing}: no such file"):
        load_hosts_config(None, env={"HPCMESH_HOSTS": str(missing)})
    with pytest.raises(ConfigError, match="no such file"):
        load_hosts_config(missing)
    with pytest.raises(ConfigError, match="is a directory"):
        load_hosts_config(tmp_path)


def test_load_error_names_the_file(tmp_path):
    f = tmp_path / "hosts.yaml"
    f.write_text("# comment\nscheduler: slrum\n")
    with pytest.raises(ConfigError) as exc:
        load_hosts_config(f)
    assert str(exc.value).startswith(f"{f}:2: unknown scheduler 'slrum'")


def test_relative_ca_is_relative_to_the_file(tmp_path):
    f = tmp_path / "sub" / "hosts.yaml"
    f.parent.mkdir()
    f.write_text("scheduler: local\ntransport: {tls: true, ca: certs/ca.pem}\n")
    cfg = load_hosts_config(f)
    assert cfg.tls_ca == str(tmp_path / "sub" / "certs" / "ca.pem")


# ----------------------------------------------------------------- scheduler


def test_unknown_scheduler_message_exact():
    err = error("""\
        # hosts
        network: {ifname: ib0}
        scheduler: slrum
        """)
    assert str(err) == ("hosts.yaml:3: unknown scheduler 'slrum'; allowed: local, slurm, "
                        "ssh, static (did you mean 'slurm'?)")
    assert err.line == 3 and err.key == "scheduler" and err.value == "slrum"
    assert err.allowed == SCHEDULERS


def test_scheduler_not_a_string():
    err = error("scheduler: [slurm]\n")
    assert str(err) == ("hosts.yaml:1: scheduler must be a name, got a list; allowed: local, "
                        "slurm, ssh, static")


def test_missing_scheduler():
    err = error("\nworkers: [tcp://a:1]\n")
    assert str(err) == ("hosts.yaml:2: missing key 'scheduler'; allowed: local, slurm, "
                        "ssh, static")


def test_empty_file():
    err = error("# nothing here\n")
    assert "hosts.yaml: empty hosts configuration" in str(err)
    assert "allowed: local, slurm, ssh, static" in str(err)


def test_top_level_must_be_mapping():
    err = error("- scheduler: local\n")
    assert str(err) == "hosts.yaml:1: the top level must be a mapping, got a list"


def test_yaml_syntax_error_has_line():
    err = error("scheduler: local\nnetwork: {ifname: ib0\n")
    assert str(err).startswith("hosts.yaml:3: invalid YAML")


def test_multiple_documents_rejected():
    err = error("scheduler: local\n---\nscheduler: ssh\n")
    assert "hosts.yaml:2: invalid YAML" in str(err)


def test_duplicate_key():
    err = error("scheduler: local\nprocesses_per_host: 2\nscheduler: ssh\n")
    assert str(err) == ("hosts.yaml:3: duplicate key 'scheduler' (first given on line 1)")


def test_unsafe_tag_rejected():
    err = error("scheduler: !!python/name:os.system local\n")
    assert str(err).startswith("hosts.yaml:1: invalid YAML")


# ----------------------------------------------------------------- keys


def test_unknown_key_with_suggestion():
    err = error("scheduler: ssh\nhots: node[1-2]\n")
    assert str(err) == ("hosts.yaml:2: unknown key 'hots' for scheduler ssh; allowed: "
                        "hosts, ssh_args, python, scheduler, network, transport "
                        "(did you mean 'hosts'?)")
    assert err.key == "hots"


def test_key_of_another_scheduler():
    err = error("scheduler: slurm\njob: {nodes: 2}\nhosts: [a, b]\n")
    assert str(err) == ("hosts.yaml:3: key 'hosts' belongs to scheduler ssh, not slurm; "
                        "allowed: job, srun_args, scheduler, network, transport")


def test_extension_keys_are_ignored_and_anchors_work():
    cfg = parse("""\
        x-common: &net
          ifname: ib0
        scheduler: local
        network: *net
        """)
    assert cfg.network_ifname == "ib0"


def test_non_string_key():
    err = error("scheduler: local\n1: x\n")
    assert str(err) == "hosts.yaml:2: keys of the top level must be strings, got integer 1"


# ----------------------------------------------------------------- local


def test_local_defaults():
    cfg = parse("scheduler: local\n")
    assert cfg == HostsConfig(scheduler="local", source="hosts.yaml")
    assert cfg.path is None and cfg.network_ifname is None and cfg.tls is False


@pytest.mark.parametrize("value, shown", [("0", "integer 0"), ("four", "string 'four'"),
                                          ("true", "boolean true"), ("1.5", "number 1.5")])
def test_processes_per_host_bad(value, shown):
    err = error(f"scheduler: local\n\nprocesses_per_host: {value}\n")
    assert str(err) == f"hosts.yaml:3: processes_per_host must be a positive integer, got {shown}"


# ----------------------------------------------------------------- slurm


def test_slurm_job_kept_as_dict_with_lines():
    cfg = parse("""\
        scheduler: slurm
        job:
          nodes: 2
          partition: gpu
          setup: [module load cuda]
        srun_args: --cpu-bind=none --mpi=none
        """)
    assert cfg.job == {"nodes": 2, "partition": "gpu", "setup": ["module load cuda"]}
    assert cfg.srun_args == ["--cpu-bind=none", "--mpi=none"]
    # later validators (slurm/spec.py) can point at the line
    assert cfg.where("job.partition") == "hosts.yaml:4"
    assert cfg.where("job.setup[0]") == "hosts.yaml:5"
    assert cfg.where("job.no_such_key") == "hosts.yaml:2"
    err = cfg.error("job.nodes", "nodes must be at most 1", value=2)
    assert str(err) == "hosts.yaml:3: nodes must be at most 1"


def test_slurm_without_job_is_fine():
    cfg = parse("scheduler: slurm\n")
    assert cfg.job is None and cfg.srun_args == []


def test_a_number_too_long_to_read_is_a_located_error():
    # the hosts file now reads YAML with the job spec's loader; it raised a bare ValueError
    err = error("scheduler: local\nprocesses_per_host: " + "9" * 5000 + "\n")
    assert str(err) == ("hosts.yaml:2: processes_per_host: a number of more than 4300 digits; "
                        "no value here needs one")
    assert isinstance(err, SchemaError) and HostsFileError is ConfigError


def test_slurm_job_not_mapping():
    err = error("scheduler: slurm\njob:\n  - nodes: 2\n")
    assert str(err) == ("hosts.yaml:2: job must be a mapping (a Slurm job spec: nodes, "
                        "gpus_per_node, time, ...), got a list")
    assert err.key == "job"


def test_slurm_job_merge_key():
    cfg = parse("""\
        x-base: &base {partition: gpu, time: "1:00:00"}
        scheduler: slurm
        job:
          <<: *base
          nodes: 8
        """)
    assert cfg.job == {"partition": "gpu", "time": "1:00:00", "nodes": 8}


def test_srun_args_bad_item():
    err = error("scheduler: slurm\nsrun_args:\n  - --overlap\n  - {a: 1}\n")
    assert str(err) == "hosts.yaml:4: srun_args[1] must be a string, got a mapping"


def test_srun_args_not_a_list():
    err = error("scheduler: slurm\nsrun_args: {a: 1}\n")
    assert str(err) == "hosts.yaml:2: srun_args must be a list of strings, got a mapping"


def test_srun_args_unbalanced_quote():
    err = error("scheduler: slurm\nsrun_args: \"--comment='x\"\n")
    assert str(err).startswith("hosts.yaml:2: srun_args: cannot split")


# ----------------------------------------------------------------- ssh


def test_ssh_hostlist_string_and_list():
    cfg = parse("scheduler: ssh\nhosts: node[01-03],login\n")
    assert cfg.hosts == ["node01", "node02", "node03", "login"]
    cfg = parse("scheduler: ssh\nhosts:\n  - b[1-2]\n  - a\nssh_args: -p 2222\npython: python3\n")
    assert cfg.hosts == ["b1", "b2", "a"]
    assert cfg.ssh_args == ["-p", "2222"]
    assert cfg.python == "python3"


def test_ssh_args_list_with_numbers():
    cfg = parse("scheduler: ssh\nhosts: [a]\nssh_args: [-p, 2222]\n")
    assert cfg.ssh_args == ["-p", "2222"]


def test_ssh_missing_hosts():
    err = error("scheduler: ssh\n")
    assert str(err) == ("hosts.yaml:1: scheduler ssh needs 'hosts' (a list or a hostlist "
                        "like node[01-04])")


def test_ssh_bad_hostlist():
    err = error("scheduler: ssh\nhosts:\n  - ok1\n  - node[01-\n")
    assert str(err) == ("hosts.yaml:4: hosts[1]: cannot expand hostlist 'node[01-' (unbalanced "
                        "brackets); expected a Slurm hostlist like 'node[01-04,07],gpu-a[1-2]'")
    assert err.key == "hosts[1]"


def test_ssh_bad_host_name():
    err = error("scheduler: ssh\nhosts: ['node/1']\n")
    assert str(err) == ("hosts.yaml:2: hosts[0]: bad host name 'node/1' in 'node/1'; expected a "
                        "host name of letters, digits, '.', '-' and '_', optionally after 'user@'")


def test_ssh_duplicate_host():
    err = error("scheduler: ssh\nhosts:\n  - n[1-3]\n  - n2\n")
    assert str(err) == "hosts.yaml:4: host 'n2' is listed twice (also on line 3)"


def test_ssh_hosts_wrong_type():
    err = error("scheduler: ssh\nhosts: {a: 1}\n")
    assert str(err) == ("hosts.yaml:2: hosts must be a hostlist string or a list of host "
                        "names, got a mapping")
    err = error("scheduler: ssh\nhosts: [42]\n")
    assert str(err) == "hosts.yaml:2: hosts[0]: must be a host name or hostlist, got integer 42"


def test_ssh_empty_hosts():
    err = error("scheduler: ssh\nhosts: []\n")
    assert str(err) == ("hosts.yaml:2: hosts: needs at least one host (a hostlist like "
                        "'node[01-04]' or a list of host names)")


def test_ssh_python_bad():
    err = error("scheduler: ssh\nhosts: [a]\npython: 3\n")
    assert str(err) == ("hosts.yaml:3: python must be the remote Python executable (a "
                        "string), got integer 3")


def test_ssh_user_at_host():
    assert parse("scheduler: ssh\nhosts: ['me@n[1-2]']\n").hosts == ["me@n1", "me@n2"]


def test_expand_hosts_is_the_one_ssh_host_rule():
    assert expand_hosts("gpu-a[1-2],x") == ["gpu-a1", "gpu-a2", "x"]
    assert expand_hosts([" b[1-2] ", "me@a"]) == ["b1", "b2", "me@a"]

    def fails(spec) -> HostListError:
        with pytest.raises(HostListError) as err:
            expand_hosts(spec)
        assert isinstance(err.value, ValueError)
        return err.value

    assert "unbalanced brackets" in str(fails("a[3-"))
    # bounded by slurm.parsing before any list is built, per item and in all
    assert "more than 100000 hosts" in str(fails("n[1-100000000]"))
    assert str(fails(["a[1-60000]", "b[1-60000]"])) == "hosts[1]: more than 100000 hosts in all"
    err = fails(["n[1-3]", "x", "n2"])
    assert (str(err), err.index, err.first, err.name) == (
        "hosts[2]: host 'n2' is listed twice (also at index 0)", 2, 0, "n2")
    assert str(fails("n[1-3],n2")) == "hosts: hostlist 'n[1-3],n2' names 'n2' twice"
    assert "bad host name 'bad:name'" in str(fails(["bad:name"]))
    assert str(fails(["x", None])) == "hosts[1]: must be a host name or hostlist, got null"
    assert str(fails([])).startswith("hosts: needs at least one host")


# ----------------------------------------------------------------- static


def test_static_workers():
    cfg = parse("""\
        scheduler: static
        workers:
          - tcp://10.0.0.5:26600
          - tcp://[fd00::5]:1
          - tcp://node01.cluster:65535
          - unix:///run/hpcmesh/a.sock
        """)
    assert cfg.workers[1] == "tcp://[fd00::5]:1"
    assert len(cfg.workers) == 4


def test_static_bad_worker_names_the_line_and_the_rule():
    # the rule itself is transport.addresses.parse_worker_address (test_worker_addresses.py)
    err = error("scheduler: static\nworkers:\n  - tcp://ok:1\n  - 'http://10.0.0.5:80'\n")
    assert str(err) == ("hosts.yaml:4: worker 'http://10.0.0.5:80': unknown scheme 'http'; "
                        "allowed: tcp, unix, ipc (did you mean 'tcp'?)")
    assert err.key == "workers[1]"


def test_static_workers_take_what_attach_to_workers_takes():
    cfg = parse("""\
        scheduler: static
        workers:
          - ipc:///run/hpcmesh/a.sock
          - tcp://node7:4444@tcp://0.0.0.0:4444
          - service<x>@tcp://node8:1
        """)
    assert len(cfg.workers) == 3
    # a DIAL@BIND dials DIAL: the same agent twice
    err = error("scheduler: static\nworkers:\n  - tcp://a:1\n  - tcp://a:1@tcp://0.0.0.0:1\n")
    assert str(err) == ("hosts.yaml:4: worker 'tcp://a:1@tcp://0.0.0.0:1' is listed twice "
                        "(also on line 3)")


def test_static_duplicate_worker():
    err = error("scheduler: static\nworkers:\n  - tcp://a:1\n  - tcp://a:1\n")
    assert str(err) == "hosts.yaml:4: worker 'tcp://a:1' is listed twice (also on line 3)"


def test_static_missing_and_empty_workers():
    assert str(error("scheduler: static\n")) == (
        "hosts.yaml:1: scheduler static needs 'workers' (addresses like tcp://10.0.0.5:26600)")
    assert str(error("scheduler: static\nworkers: []\n")) == (
        "hosts.yaml:2: scheduler static needs at least one address in 'workers'")


def test_static_worker_not_string():
    err = error("scheduler: static\nworkers: [26600]\n")
    assert str(err) == "hosts.yaml:2: workers[0] must be an address string, got integer 26600"


# ----------------------------------------------------------------- network


def test_network_ifname_forms():
    assert parse("scheduler: local\nnetwork: {ifname: ib0}\n").network_ifname == "ib0"
    assert parse("scheduler: local\nnetwork: {ifname: [ib0, ib1]}\n").network_ifname == "ib0,ib1"
    assert parse("scheduler: local\nnetwork: {ifname: 'ib*, hsn0'}\n").network_ifname == "ib*,hsn0"
    assert parse("scheduler: local\nnetwork: {cidr: 10.0.0.0/8}\n").network_ifname == "10.0.0.0/8"
    assert parse("scheduler: local\nnetwork:\n").network_ifname is None


def test_network_ifname_feeds_rank_candidates():
    from hpcmesh.transport.netif import InterfaceInfo, rank_candidates

    cfg = parse("scheduler: local\nnetwork: {cidr: [10.1.0.0/16, 10.2.0.0/16]}\n")
    ifs = [InterfaceInfo("eth0", ("10.2.0.1",), 1, "up", True, "default-route"),
           InterfaceInfo("ib0", ("10.1.0.1",), 32, "up", False, "ipoib")]
    cands = rank_candidates(ifs, cfg.network_ifname, env={})
    assert [c.address for c in cands] == ["10.1.0.1", "10.2.0.1"]


def test_network_unknown_key():
    err = error("scheduler: local\nnetwork:\n  ifnmae: ib0\n")
    assert str(err) == ("hosts.yaml:3: unknown key 'ifnmae' in network; allowed: ifname, "
                        "cidr (did you mean 'ifname'?)")
    assert err.key == "network.ifnmae"


def test_network_bad_cidr():
    err = error("scheduler: local\nnetwork:\n  cidr: 10.0.0.0/33\n")
    assert str(err).startswith("hosts.yaml:3: network.cidr: '10.0.0.0/33' is not a network "
                               "like 10.0.0.0/8")


def test_network_both_keys():
    err = error("scheduler: local\nnetwork:\n  ifname: ib0\n  cidr: 10.0.0.0/8\n")
    assert str(err) == "hosts.yaml:4: network: give either 'ifname' or 'cidr', not both"


def test_network_not_mapping_and_bad_values():
    assert str(error("scheduler: local\nnetwork: ib0\n")) == (
        "hosts.yaml:2: network must be a mapping, got string 'ib0'")
    assert str(error("scheduler: local\nnetwork: {ifname: 3}\n")) == (
        "hosts.yaml:2: network.ifname must be a string or a list of strings, got integer 3")
    assert str(error("scheduler: local\nnetwork: {ifname: 'ib 0'}\n")) == (
        "hosts.yaml:2: network.ifname: bad entry string 'ib 0'")


# ----------------------------------------------------------------- transport


def test_transport_forms():
    cfg = parse("scheduler: local\ntransport: {tls: true}\n")
    assert cfg.tls is True and cfg.tls_ca is None
    cfg = parse("scheduler: local\ntransport: {ca: /etc/ca.pem}\n")
    assert cfg.tls is True and cfg.tls_ca == "/etc/ca.pem"  # ca implies tls
    cfg = parse("scheduler: local\ntransport: {tls: false}\n")
    assert cfg.tls is False
    cfg = parse("scheduler: local\ntransport: {ca: trust_all_connections}\n")
    assert cfg.tls_ca == "trust_all_connections"


def test_transport_errors():
    assert str(error("scheduler: local\ntransport:\n  tsl: true\n")) == (
        "hosts.yaml:3: unknown key 'tsl' in transport; allowed: tls, ca (did you mean 'tls'?)")
    assert str(error("scheduler: local\ntransport:\n  tls: maybe\n")) == (
        "hosts.yaml:3: transport.tls must be true or false, got string 'maybe'")
    assert str(error("scheduler: local\ntransport: {tls: false, ca: /x}\n")) == (
        "hosts.yaml:2: transport.ca is set but transport.tls is false; remove ca or set "
        "tls: true")
    assert str(error("scheduler: local\ntransport:\n  ca: [a]\n")) == (
        "hosts.yaml:3: transport.ca must be a file path or 'trust_all_connections', got a list")
    assert str(error("scheduler: local\ntransport: [tls]\n")) == (
        "hosts.yaml:2: transport must be a mapping, got a list")


def test_error_source_in_message_default():
    with pytest.raises(ConfigError, match=r"^<string>:1: unknown scheduler"):
        parse_hosts_config("scheduler: nope\n")
