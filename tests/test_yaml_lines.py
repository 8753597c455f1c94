"""The YAML line index shared by hosts configs and job specs."""

import pytest
import yaml

from hpcmesh.yaml_lines import (DuplicateKey, allowed_suffix, describe_yaml_error, index_lines,
                                nearest_line)

TEXT = """\
base: &b
  nodes: 2
job:
  <<: *b
  time: 01:30:00
  setup:
    - echo a
    - echo b
"""


def _index(text):
    loader = yaml.SafeLoader(text)
    lines, raw = {}, {}
    index_lines(loader, loader.get_single_node(), lines, raw)
    return lines, raw


def test_lines_of_keys_items_and_merged_keys_and_raw_text():
    lines, raw = _index(TEXT)
    assert lines["job"] == 3 and lines["job.time"] == 5 and lines["job.setup[1]"] == 8
    assert lines["job.nodes"] == 2                      # merged in from the anchor
    assert raw["job.time"] == "01:30:00"                # YAML 1.1 would read 5400
    assert nearest_line(lines, "job.setup[1].x.y") == 8
    assert nearest_line(lines, "nothing.here") is None


def test_duplicate_key_names_both_lines():
    with pytest.raises(DuplicateKey, match=r"duplicate key 'job.time' \(first given on line 2\)"):
        _index("job:\n  time: 1\n  time: 2\n")


def test_messages():
    message, line = describe_yaml_error(pytest.raises(yaml.YAMLError, yaml.safe_load,
                                                      "a: [1, 2\nb: 3\n").value)
    assert message.startswith("invalid YAML: ") and line == 2
    assert allowed_suffix(["local", "slurm"], "slrum") == \
        "; allowed: local, slurm (did you mean 'slurm'?)"
    assert allowed_suffix([], "x") == ""


def test_a_nul_byte_is_a_located_error_in_hosts_files_and_job_specs(tmp_path):
    # before: yaml's bare ReaderError, with neither the file nor the line
    from hpcmesh.hosts_file import ConfigError, load_hosts_config
    from hpcmesh.slurm.spec import SpecError, parse_yaml_with_lines
    path = tmp_path / "hosts.yaml"
    path.write_bytes(b"scheduler: local\n\x00oops: 1\n")
    with pytest.raises(ConfigError, match=r"hosts\.yaml:2: invalid YAML: unacceptable "
                                          r"character #x0000 \(special characters"):
        load_hosts_config(str(path))
    with pytest.raises(SpecError, match=r"job\.yaml:3: invalid YAML: unacceptable character "
                                        r"#x0007"):
        parse_yaml_with_lines("meshes:\n  a:\n    nodes: 1\x07\n", "job.yaml")
