"""monarch.job.shell from a script: the end of its input stops what runs in the
foreground (a `sleep 30` does not keep it for 30 s), a reader that goes away leaves
nothing buffered to fail at exit, and a mesh of two hosts is refused."""
import subprocess
import sys
import time

from monarch.actor import this_host
from monarch.job import ProcessJob, shell


def client() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "client"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


if __name__ == "__main__":
    if sys.argv[1:] == ["client"]:
        sys.exit(shell(this_host()))

    start = time.monotonic()
    run = client()
    out, err = run.communicate(b"sleep 30\n", timeout=120)
    print("ended by the end of input:", time.monotonic() - start < 20)
    print("status:", run.returncode)

    run = client()
    run.stdin.write(b"yes | head -300000\n")
    run.stdin.flush()
    run.stdout.read(100)
    run.stdout.close()          # the reader goes away
    err = run.stderr.read().decode()
    run.wait(timeout=120)
    print("broken pipe fails the call:", run.returncode != 0)
    print("nothing left to flush at exit:", "Exception ignored" not in err)
    run.stdin.close()

    job = ProcessJob({"hosts": 2})
    try:
        shell(job.state(cached_path=None).hosts)
    except ValueError as e:
        print("two hosts:", "singleton HostMesh" in str(e))
    job.kill()
