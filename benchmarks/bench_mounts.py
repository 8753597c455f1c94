"""remote_mount on the Slurm test cluster (issue 17's speed figures), in one run:

    .venv/bin/python benchmarks/bench_mounts.py [--json benchmarks/out/mounts.json]

Needs root (drop_caches) and the test cluster (tests/cluster/up.sh). The tree is hpcmesh's
own ``.venv`` (torch included, ~1.4 GB): what a user mounts to spare NFS an import storm.

1. Client upload, 3 nodes / 1 node: the tree pushed into fresh, empty blob stores of one
   node, then of three (``blob_transfer.push_tree``: blocks down a chain of hosts). Figures:
   the bytes the client sent (``PushStats.uploaded_bytes``, counted as each block leaves)
   and the bytes the nodes stored, and the push's wall time. (Not socket counters: on the
   test cluster the client reaches a node's processes over their Unix sockets, through
   the /tmp every node shares, which no TCP counter sees.)
2. ``import torch`` on node1, in a fresh interpreter, with the venv's python from the
   mount against the venv itself on local disk: cold (first after the mount came up; local
   after ``drop_caches``) and warm (median of 5 more each, mount and local alternating).
3. First start of 3 x 2 processes with their python from the mount (the agent execs it) ->
   every actor answered one call; beside it the same with the agent's own python (forked
   from its fork server: what a job without a mount gets).
4. Reading a 1 GiB file through the mount (1 MiB reads) against the same bytes read from the
   blob file on local disk, page cache dropped before each cold read.

The test cluster's nodes share this machine's disk and page cache: "local disk" is the same
disk the blobs are on, so the ratios show what FUSE costs, not what NFS would.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from hpcmesh.actor import Actor, endpoint  # noqa: E402
from hpcmesh.actor.blob_transfer import BlobReceiver, push_tree  # noqa: E402
from hpcmesh.file_tree import scan_tree  # noqa: E402
from hpcmesh.job import SlurmJob  # noqa: E402
from hpcmesh.mounts.remote_mount import hosts_of  # noqa: E402

VENV = os.path.join(REPO, ".venv")


def drop_caches() -> None:
    subprocess.run(["sync"], check=False)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class Probe(Actor):
    @endpoint
    def import_torch(self, python: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([python, "-c", "import torch"], check=True)
        return time.perf_counter() - t0

    @endpoint
    def read_mb_s(self, path: str) -> float:
        t0 = time.perf_counter()
        n = 0
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                n += len(chunk)
        return n / (time.perf_counter() - t0) / 1e6

    @endpoint
    def ping(self) -> int:
        return os.getpid()


def upload_ratio(state, tree, out: dict) -> None:
    base = tempfile.mkdtemp(prefix="hpcmesh-bench-store-", dir="/tmp")
    try:
        for n in (1, 3):
            hosts = state.hosts.slice(hosts=slice(0, n))
            procs = hosts.spawn_procs(name=f"push{n}")
            receivers = procs.spawn("r", BlobReceiver, os.path.join(base, f"n{n}", "{host}"))
            receivers.hostname.call().get(timeout=60)
            stats = push_tree(receivers, tree, VENV)
            out[f"push_{n}"] = {"uploaded_bytes": stats.uploaded_bytes,
                                "stored_bytes": stats.stored_bytes, "seconds": stats.seconds,
                                "messages": stats.messages}
            print(f"push to {n} node(s): the client sent {stats.uploaded_bytes / 1e6:.0f} MB, "
                  f"the nodes stored {stats.stored_bytes / 1e6:.0f} MB, {stats.seconds:.1f} s "
                  f"({stats.stored_bytes / stats.seconds / 1e6:.0f} MB/s stored)", flush=True)
            procs.stop().get(timeout=60)
        out["upload_ratio"] = out["push_3"]["uploaded_bytes"] / out["push_1"]["uploaded_bytes"]
        print(f"client upload, 3 nodes / 1 node: {out['upload_ratio']:.3f}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    out: dict = {"tree": VENV}
    t0 = time.perf_counter()
    tree = scan_tree(VENV)
    out["tree_bytes"] = tree.total_bytes()
    out["tree_files"] = len(tree.blobs())
    out["scan_s"] = time.perf_counter() - t0
    print(f"tree {VENV}: {tree.total_bytes() / 1e6:.0f} MB in {len(tree.entries)} entries, "
          f"scanned (hashed) in {out['scan_s']:.1f} s", flush=True)
    t0 = time.perf_counter()
    tree_again = scan_tree(VENV, tree)
    out["rescan_s"] = time.perf_counter() - t0
    assert tree_again.version() == tree.version()

    data_dir = tempfile.mkdtemp(prefix="hpcmesh-bench-data-", dir="/tmp")
    with open(os.path.join(data_dir, "1gib.bin"), "wb") as f:
        for _ in range(1024):
            f.write(os.urandom(1 << 20))
    mnt = tempfile.mkdtemp(prefix="hpcmesh-bench-mnt-", dir="/tmp")
    data_mnt = tempfile.mkdtemp(prefix="hpcmesh-bench-datamnt-", dir="/tmp")
    job = SlurmJob(meshes={"hosts": 3}, job_name="hpcm-bench-mounts", timeout=120,
                   time_limit="30:00", log_dir=os.path.join(data_dir, "logs"))
    try:
        state = job.state(cached_path=None)
        upload_ratio(state, tree, out)

        job.remote_mount(VENV, mntpoint=mnt, python_exe="bin/python")
        job.remote_mount(data_dir, mntpoint=data_mnt, python_exe=None, meshes=["hosts"])
        t0 = time.perf_counter()
        state = job.state(cached_path=None)
        out["mount_s"] = time.perf_counter() - t0
        subprocess.run(["sync"], check=False)   # the GBs just written: not under the timings
        print(f"mount of the venv and the 1 GiB file on 3 nodes: {out['mount_s']:.1f} s",
              flush=True)

        # 3. first start of 3 x 2 processes
        for label, mesh in (("mounted_python", state.hosts),
                            ("agent_python", hosts_of(state.hosts.refs))):
            t0 = time.perf_counter()
            procs = mesh.spawn_procs(per_host={"gpus": 2}, name=f"start-{label}")
            procs.spawn("p", Probe).ping.call().get(timeout=300)
            out[f"start_3x2_{label}_s"] = time.perf_counter() - t0
            print(f"3 x 2 processes up and answering, {label}: "
                  f"{out[f'start_3x2_{label}_s']:.2f} s", flush=True)
            if label == "mounted_python":
                probe_procs = procs
            else:
                procs.stop().get(timeout=60)
        probe = probe_procs.spawn("q", Probe).slice(hosts=0, gpus=0)

        # 2. import torch, node1
        mounted_python = os.path.join(mnt, "bin", "python")
        local_python = os.path.join(VENV, "bin", "python")
        out["import_torch_mount_cold_s"] = probe.import_torch.call_one(mounted_python).get(
            timeout=300)
        drop_caches()
        out["import_torch_local_cold_s"] = probe.import_torch.call_one(local_python).get(
            timeout=300)
        warm: dict[str, list[float]] = {"mount": [], "local": []}
        for _ in range(5):          # alternating, so the machine's drift hits both alike
            for where, python in (("mount", mounted_python), ("local", local_python)):
                warm[where].append(probe.import_torch.call_one(python).get(timeout=300))
        for where, times in warm.items():
            out[f"import_torch_{where}_warm_s"] = statistics.median(times)
            out[f"import_torch_{where}_warm_all_s"] = times
        for k in ("cold", "warm"):
            out[f"import_torch_{k}_ratio"] = (out[f"import_torch_mount_{k}_s"] /
                                             out[f"import_torch_local_{k}_s"])
            print(f"import torch {k}: mount {out[f'import_torch_mount_{k}_s']:.2f} s, local "
                  f"{out[f'import_torch_local_{k}_s']:.2f} s, ratio "
                  f"{out[f'import_torch_{k}_ratio']:.2f}", flush=True)

        # 4. 1 GiB read
        blob = [m for m in state.mounts if m.spec.source == data_dir][0].tree.entries[
            "1gib.bin"].digest
        store = f"/tmp/hpcmesh-blobs-{os.getuid()}-node1/blobs/{blob[:2]}/{blob}"
        drop_caches()
        out["read_1gib_mount_cold_mb_s"] = probe.read_mb_s.call_one(
            os.path.join(data_mnt, "1gib.bin")).get(timeout=300)
        out["read_1gib_mount_warm_mb_s"] = probe.read_mb_s.call_one(
            os.path.join(data_mnt, "1gib.bin")).get(timeout=300)
        drop_caches()
        out["read_1gib_local_cold_mb_s"] = probe.read_mb_s.call_one(store).get(timeout=300)
        out["read_1gib_local_warm_mb_s"] = probe.read_mb_s.call_one(store).get(timeout=300)
        for k in ("cold", "warm"):
            print(f"read 1 GiB {k}: mount {out[f'read_1gib_mount_{k}_mb_s']:.0f} MB/s, local "
                  f"{out[f'read_1gib_local_{k}_mb_s']:.0f} MB/s", flush=True)
    finally:
        job.kill()
        for d in (data_dir, mnt, data_mnt):
            shutil.rmtree(d, ignore_errors=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
