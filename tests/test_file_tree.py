"""hpcmesh.file_tree: a directory as data (pure: only the filesystem under tmp_path)."""

import os
import socket

import pytest

from hpcmesh.file_tree import DIR, FILE, LINK, file_digest, scan_tree


def _tree(tmp_path):
    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "same.txt").write_text("X = 1\n")           # same content: one blob
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    os.symlink("pkg/mod.py", root / "link")
    os.symlink("pkg", root / "dirlink")                  # a link to a dir: kept, not walked
    return root


def test_a_scan_records_kinds_modes_links_and_content_digests(tmp_path):
    root = _tree(tmp_path)
    tree = scan_tree(str(root))
    e = tree.entries
    assert e[""].kind == DIR and e["pkg"].kind == DIR
    assert e["pkg/mod.py"].kind == FILE and e["pkg/mod.py"].size == 6
    assert e["pkg/mod.py"].digest == file_digest(str(root / "pkg" / "mod.py"))
    assert e["run.sh"].mode == 0o755
    assert (e["link"].kind, e["link"].target) == (LINK, "pkg/mod.py")
    assert (e["dirlink"].kind, e["dirlink"].target) == (LINK, "pkg")
    assert "dirlink/mod.py" not in e
    assert len(tree.blobs()) == 2                        # mod.py and same.txt share one
    assert sorted(tree.children()[""]) == ["dirlink", "link", "pkg", "run.sh", "same.txt"]


def test_the_version_changes_with_content_and_only_then(tmp_path):
    root = _tree(tmp_path)
    first = scan_tree(str(root))
    assert scan_tree(str(root), first).version() == first.version()
    (root / "pkg" / "mod.py").write_text("X = 2\n")
    assert scan_tree(str(root), first).version() != first.version()


def test_a_rescan_reads_only_files_whose_inode_size_or_mtime_changed(tmp_path, monkeypatch):
    root = _tree(tmp_path)
    first = scan_tree(str(root))
    read = []
    import hpcmesh.file_tree as ft
    real = ft.file_digest
    monkeypatch.setattr(ft, "file_digest", lambda p: read.append(p) or real(p))
    scan_tree(str(root), first)
    assert read == []
    (root / "run.sh").write_text("#!/bin/sh\necho changed\n")
    scan_tree(str(root), first)
    assert read == [str(root / "run.sh")]


def test_sockets_are_skipped_with_the_reason(tmp_path):
    root = _tree(tmp_path)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(root / "sock"))
    try:
        tree = scan_tree(str(root))
    finally:
        s.close()
    assert "sock" not in tree.entries
    assert "not a regular file" in tree.skipped["sock"]


def test_what_travels_leaves_the_client_stat_keys_behind(tmp_path):
    import pickle
    tree = scan_tree(str(_tree(tmp_path)))
    assert tree.stat_keys
    again = pickle.loads(pickle.dumps(tree))
    assert again.stat_keys == {} and again.entries == tree.entries


def test_a_missing_or_non_directory_root_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="cannot read the directory to ship.*nowhere"):
        scan_tree(str(tmp_path / "nowhere"))
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        scan_tree(str(tmp_path / "f"))
