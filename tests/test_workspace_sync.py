"""HostMesh.sync_workspace (Monarch's name): the copy-based way to get a client directory
onto the hosts (issue 17). Real processes on this host; contents are unique per test so a
blob store left by an earlier run cannot make a push look free."""

import os

import pytest

from hpcmesh.actor import this_host
from hpcmesh.actor.workspace import MANIFEST


def _src(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text(f"WHERE = {str(tmp_path)!r}\n")
    (src / "big.bin").write_bytes(os.urandom(9 << 20))     # three blocks of 4 MiB
    (src / "tool.sh").write_text(f"#!/bin/sh\n# {tmp_path}\n")
    (src / "tool.sh").chmod(0o750)
    os.symlink("pkg/mod.py", src / "link")
    return src


def _sync(src, dst):
    return this_host().sync_workspace({str(src): str(dst)}).get(timeout=120)


def test_a_sync_ships_the_tree_then_only_what_changed(tmp_path):
    src, dst = _src(tmp_path), tmp_path / "dst"
    first = _sync(src, dst)
    push = first.pushes[str(src)]
    assert push.uploaded_bytes == (9 << 20) + len((src / "pkg" / "mod.py").read_bytes()) + \
        len((src / "tool.sh").read_bytes())
    assert (dst / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert (dst / "pkg" / "mod.py").read_text() == (src / "pkg" / "mod.py").read_text()
    assert os.readlink(dst / "link") == "pkg/mod.py"
    assert (dst / "tool.sh").stat().st_mode & 0o777 == 0o750
    assert (dst / "big.bin").stat().st_mtime_ns == (src / "big.bin").stat().st_mtime_ns
    (counts,) = first.files[str(src)].values()
    assert counts == {"written": 4, "unchanged": 0, "removed": 0}

    again = _sync(src, dst)
    assert again.pushes[str(src)].uploaded_bytes == 0
    (counts,) = again.files[str(src)].values()
    assert counts == {"written": 0, "unchanged": 4, "removed": 0}

    (src / "pkg" / "mod.py").write_text(f"WHERE = {str(tmp_path)!r}  # edited\n")
    (src / "tool.sh").unlink()
    third = _sync(src, dst)
    assert third.pushes[str(src)].uploaded_bytes == len((src / "pkg" / "mod.py").read_bytes())
    assert "edited" in (dst / "pkg" / "mod.py").read_text()
    assert not (dst / "tool.sh").exists()
    (counts,) = third.files[str(src)].values()
    assert counts == {"written": 1, "unchanged": 2, "removed": 1}


def test_files_the_sync_never_wrote_are_left_alone(tmp_path):
    src, dst = _src(tmp_path), tmp_path / "dst"
    dst.mkdir()
    (dst / "results.csv").write_text("mine\n")
    _sync(src, dst)
    (src / "big.bin").unlink()
    _sync(src, dst)
    assert (dst / "results.csv").read_text() == "mine\n"
    assert not (dst / "big.bin").exists()
    assert (dst / MANIFEST).exists()


def test_bad_input_is_refused_before_any_process_starts(tmp_path):
    host = this_host()
    with pytest.raises(NotADirectoryError, match="is not a directory on the client"):
        host.sync_workspace(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="must be an absolute path on the hosts"):
        host.sync_workspace({str(tmp_path): "relative/dir"})
    with pytest.raises(TypeError, match="takes a directory, a list of directories"):
        host.sync_workspace(42)
    with pytest.raises(NotImplementedError, match="auto_reload"):
        host.sync_workspace(str(tmp_path), auto_reload=True)


def test_a_workspace_object_with_dirs_lands_at_the_same_paths(tmp_path):
    src = _src(tmp_path)

    class Workspace:            # Monarch's Workspace(dirs=[...]) shape
        dirs = [str(src)]
    result = this_host().sync_workspace(Workspace()).get(timeout=120)
    (counts,) = result.files[str(src)].values()
    # the destination is the source itself here: every file is already in place
    assert counts["written"] == 4 and (src / MANIFEST).exists()


def test_a_file_that_shrinks_while_it_is_shipped_is_named(tmp_path):
    """Before: the short last block went out and the hosts waited for the rest for ever
    (the blob never completed, the push reported success)."""
    from hpcmesh.actor.blob_transfer import blocks_to_send
    from hpcmesh.file_tree import scan_tree
    src = _src(tmp_path)
    tree = scan_tree(str(src))
    (src / "big.bin").write_bytes(os.urandom(5 << 20))
    with pytest.raises(ValueError, match="big.bin changed while it was being shipped"):
        list(blocks_to_send(tree, str(src), sorted(tree.blobs())))


def test_a_folder_that_became_a_link_out_of_the_destination_is_not_followed(tmp_path):
    """Files the sync wrote under data/ are not deleted through data -> elsewhere/."""
    src, dst = _src(tmp_path), tmp_path / "dst"
    (src / "data").mkdir()
    (src / "data" / "x.txt").write_text(f"x {tmp_path}\n")
    _sync(src, dst)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.txt").write_text("precious\n")
    (src / "data" / "x.txt").unlink()
    (src / "data").rmdir()
    os.symlink(str(elsewhere), src / "data")
    _sync(src, dst)
    assert (elsewhere / "x.txt").read_text() == "precious\n"
    assert os.readlink(dst / "data") == str(elsewhere)
