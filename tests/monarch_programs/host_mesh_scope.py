"""Whose processes HostMesh.stop() stops, and who may shut a host mesh down: two HostMeshes
of the same job (two state() calls: the same hosts) each spawn processes; hm1.stop() stops
those spawned through hm1 only. A copy of a HostMesh that was pickled and unpickled is not
its owner: its shutdown() raises."""
import os
import pickle
import time

from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def wait(fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not fn() and time.monotonic() < deadline:
        time.sleep(0.1)


def main() -> None:
    job = ProcessJob({"hosts": 2})
    hm1 = job.state(cached_path=None).hosts
    hm2 = job.state(cached_path=None).hosts
    pids1 = list(hm1.spawn_procs(per_host={"gpus": 1}, name="proc1")
                 .spawn("pids", Pid).pid.call().get().values())
    pm2 = hm2.spawn_procs(per_host={"gpus": 1}, name="proc2")
    pids2 = list(pm2.spawn("pids", Pid).pid.call().get().values())
    print("processes", len(pids1), len(pids2))
    hm1.stop().get()
    wait(lambda: not any(alive(p) for p in pids1))
    print("hm1's processes alive", [alive(p) for p in pids1])
    print("hm2's processes alive", [alive(p) for p in pids2])

    copy = pickle.loads(pickle.dumps(hm2))
    try:
        copy.shutdown().get()
        print("the copy shut the hosts down")
    except RuntimeError:
        print("shutdown() of an unpickled copy raises RuntimeError")
    print("hm2's processes still alive", [alive(p) for p in pids2])
    hm2.shutdown().get()
    wait(lambda: not any(alive(p) for p in pids2))
    print("after hm2.shutdown()", [alive(p) for p in pids2])
    job.kill()


if __name__ == "__main__":
    main()
