"""HostMesh's other public names: spawn_procs(bootstrap=...) runs a callable in each new
process before any actor, proc_bind pins each process to CPUs, stream_logs and
is_fake_in_process, context().actor_instance.proc_mesh, and `async with` a HostMesh,
which shuts it down on exit."""
import asyncio
import os

from monarch.actor import Actor, config, context, current_rank, endpoint, this_host
from monarch.job import ProcessJob


def set_flag() -> None:
    os.environ["BOOTSTRAPPED"] = f"rank {current_rank().rank}"


async def async_set_flag() -> None:
    await asyncio.sleep(0)
    os.environ["BOOTSTRAPPED"] = "async"


class Probe(Actor):
    def __init__(self) -> None:
        self.seen_at_init = os.environ.get("BOOTSTRAPPED")

    @endpoint
    def flag(self) -> str:
        return f"{self.seen_at_init}"

    @endpoint
    def cpus(self) -> list:
        return sorted(os.sched_getaffinity(0))

    @endpoint
    def proc_mesh(self) -> str:
        pm = context().actor_instance.proc_mesh
        return f"{type(pm).__name__} {dict(pm.extent)}"


async def main() -> None:
    host = this_host()
    print("stream_logs:", type(host.stream_logs).__name__)
    print("is_fake_in_process:", host.is_fake_in_process)
    print("config:", config.prefix_python_logs_with_actor)

    procs = host.spawn_procs(per_host={"gpus": 2}, bootstrap=set_flag)
    print("bootstrap:", sorted((await procs.spawn("p", Probe).flag.call()).values()))
    await procs.stop()
    procs = host.spawn_procs(per_host={"gpus": 2}, bootstrap=async_set_flag)
    probes = procs.spawn("p", Probe)
    print("async bootstrap:", sorted((await probes.flag.call()).values()))
    print("proc_mesh:", sorted((await probes.proc_mesh.call()).values()))
    await procs.stop()

    procs = host.spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": "1"}, {"cpus": "0"}])
    print("proc_bind:", list((await procs.spawn("p", Probe).cpus.call()).values()))
    await procs.stop()
    try:
        host.spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": "0"}])
    except ValueError as e:
        print("ValueError:", e)

    job = ProcessJob({"hosts": 1})
    hosts = job.state(cached_path=None).hosts
    async with hosts as entered:
        print("entered is the mesh:", entered is hosts)
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        print("inside:", (await procs.spawn("p", Probe).flag.call()).values())
    try:
        hosts.spawn_procs(per_host={"gpus": 1})
    except RuntimeError as e:
        print("RuntimeError:", e)
    try:
        async with hosts:
            pass
    except RuntimeError as e:
        print("RuntimeError:", e)
    job.kill()


if __name__ == "__main__":
    asyncio.run(main())
