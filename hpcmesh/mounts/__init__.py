"""Code and data to and from the hosts: ``remote_mount`` (a client directory as a read-only
FUSE mount on every host) and ``gather_mount`` (every host's directory on the client). The
copy-based ``HostMesh.sync_workspace`` lives with the actor API (``actor/workspace.py``)."""
