"""Workers as Monarch starts them: run_worker_loop_forever(address=...,
ca="trust_all_connections") in a process with no job secret, over ipc://, DIAL@BIND and a
listening socket handed down (tcp://host:fdN); attach_to_workers() is called before the
worker listens, and waits for it."""
import os
import socket
import subprocess
import sys
import tempfile
import time

from monarch.actor import Actor, attach_to_workers, endpoint, run_worker_loop_forever


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(listen: str, **popen) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if "SECRET" not in k}   # no job secret
    return subprocess.Popen([sys.executable, __file__, "worker", listen], env=env, **popen)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        time.sleep(1.0)                 # sleep: a worker that starts late: not listening yet when the client attaches
        run_worker_loop_forever(address=sys.argv[2], ca="trust_all_connections")
        sys.exit(0)

    folder = tempfile.mkdtemp()
    port = free_port()
    listener = socket.create_server(("127.0.0.1", 0))
    forms = {
        "ipc": (f"ipc://{folder}/worker.sock", f"ipc://{folder}/worker.sock", {}),
        "dial@bind": (f"tcp://127.0.0.1:{port}@tcp://0.0.0.0:{port}",
                      f"tcp://127.0.0.1:{port}@tcp://0.0.0.0:{port}", {}),
        "fd": (f"tcp://127.0.0.1:fd{listener.fileno()}",
               f"tcp://127.0.0.1:{listener.getsockname()[1]}",
               {"pass_fds": (listener.fileno(),)}),
    }
    for form, (listen, dial, popen) in forms.items():
        w = worker(listen, **popen)
        try:
            hosts = attach_to_workers(workers=[dial], ca="trust_all_connections")
            hosts.initialized.get()
            procs = hosts.spawn_procs()
            pid = procs.spawn("pid", Pid).pid.call_one().get()
            print(form, "ran an actor on the worker:", pid not in (os.getpid(), w.pid))
            procs.stop().get()
        finally:
            w.terminate()
            w.wait(timeout=60)
    listener.close()
