"""The schema kit shared by hosts files and job specs (pure)."""

import pytest
import yaml

from hpcmesh.yaml_lines import (DuplicateKey, Invalid, SchemaError, Where, allowed_suffix,
                                check_keys, count, describe, describe_yaml_error, index_lines,
                                load_yaml, nearest_line)

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


class _Kind(SchemaError):
    pass


def test_load_yaml_gives_data_lines_raw_and_located_errors_of_the_callers_kind():
    data, lines, raw = load_yaml("# c\na: 1\nb:\n  - x\n", "f.yaml")
    assert data == {"a": 1, "b": ["x"]}
    assert lines == {"": 2, "a": 2, "b": 3, "b[0]": 4} and raw["a"] == "1"
    assert nearest_line(lines, "nothing.here") == 2         # the document's line
    assert load_yaml("", "f.yaml") == (None, {}, {})
    for text, line in (("a: 1\na: 2\n", 2), ("a: [1\n", 2), ("a: 1\x00\n", 1)):
        with pytest.raises(_Kind) as err:
            load_yaml(text, "f.yaml", _Kind)
        assert err.value.source == "f.yaml" and err.value.line == line
    with pytest.raises(_Kind, match=r"^f\.yaml:1: a: a number of more than 4300 digits"):
        load_yaml("a: " + "9" * 5000, "f.yaml", _Kind)


def test_schema_error_wording_and_a_lossless_recast():
    err = SchemaError("unknown key 'slrum'", source="h.yaml", line=3, key="scheduler",
                      value="slrum", allowed=("local", "slurm"))
    assert str(err) == "h.yaml:3: unknown key 'slrum'; allowed: local, slurm (did you mean 'slurm'?)"
    assert str(SchemaError("x", value="slrum", allowed=("slurm",), suggest=False)) == \
        "x; allowed: slurm"
    assert str(SchemaError("x", source="h.yaml")) == "h.yaml: x"
    back = err.recast(_Kind)
    assert type(back) is _Kind and str(back) == str(err)
    assert (back.source, back.line, back.key, back.value, back.allowed, back.problem) == \
        (err.source, err.line, err.key, err.value, err.allowed, err.problem)
    assert isinstance(back, ValueError) and isinstance(Invalid("x"), ValueError)


def test_where_locates_by_dotted_path_under_a_prefix():
    w = Where("h.yaml", {"": 1, "job": 2, "job.setup[1]": 5}, {"job.time": "01:30:00"},
              prefix="job", kind=_Kind)
    assert w.path("setup", 1) == "job.setup[1]" and w.path() == "job"
    assert w.line("job.setup[1].x") == 5 and w.line("job.nodes") == 2
    err = w.error(w.path("nodes"), "bad", value=3)
    assert type(err) is _Kind and (str(err), err.key) == ("h.yaml:2: bad", "job.nodes")
    assert w.error("", "missing", key="scheduler").key == "scheduler"
    assert w.text("job.time", 5400) == "01:30:00" and w.text("job.x", 4) == 4
    assert str(Where("<dict>").error("a", "bad")) == "<dict>: bad"


@pytest.mark.parametrize("value, text", [
    (None, "null"), (True, "boolean true"), (5400, "integer 5400"), (1.5, "number 1.5"),
    ("x", "string 'x'"), ("y" * 100, f"string {'y' * 60!r}... (100 characters)"),
    ({}, "a mapping"), ([], "a list"), (10**5000, "an integer of about 5000 digits"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else type(v).__name__)
def test_describe_says_the_kind_and_a_bounded_value(value, text):
    assert describe(value) == text


def test_check_keys_and_count():
    w = Where("s.yaml", {"": 1, "m": 1, "m.nodse": 2, "m.1": 3})
    check_keys(w, {"nodes": 1}, ("nodes", "time"), "mesh 'm'", ("m",))
    with pytest.raises(SchemaError) as err:
        check_keys(w, {"nodse": 1}, ("nodes", "time"), "mesh 'm'", ("m",))
    assert str(err.value) == ("s.yaml:2: unknown key 'nodse' in mesh 'm'; allowed: nodes, "
                              "time (did you mean 'nodes'?)")
    with pytest.raises(SchemaError, match=r"^s\.yaml:3: keys of mesh 'm' must be strings, "
                                          r"got integer 1$"):
        check_keys(w, {1: 1}, None, "mesh 'm'", ("m",))
    assert count("n", 4) == 4 and count("n", None, optional=True) is None
    assert count("n", 0, minimum=0) == 0
    for value, message in ((0, "n must be a positive integer, got integer 0"),
                           (True, "n must be a positive integer, got boolean true"),
                           ("4", "n must be a positive integer, got string '4'"),
                           (9, "n must be at most 8 (the limit), got integer 9")):
        with pytest.raises(Invalid) as err:
            count("n", value, maximum=8, why="the limit")
        assert str(err.value) == message
