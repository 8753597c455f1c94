"""Survive Slurm's requeue, preemption and time limit: checkpoint on the notice, resume.

    python examples/slurm_requeue.py --ckpt /shared/me/run1        # 2 nodes, 200 steps

The job is submitted with ``--requeue`` and ``--signal=B:USR1@90``. Slurm's notices reach
the host agents, which record them and go on serving; the controller sees them
(``job.watch_notices``) and has every trainer write a checkpoint:

- the warning before the time limit (``--signal``: USR1 90 s before);
- a preemption on a site that gives a grace (the partition's ``GraceTime``): Slurm sends
  SIGTERM to the job's tasks at once and SIGKILL after GraceTime; in a job step hpcmesh's
  agents and processes take that SIGTERM as a notice, not a death (as submitit's tasks
  do), so the checkpoint is written in the grace. (With
  ``SlurmctldParameters=preempt_send_user_signal`` Slurm sends the ``--signal`` instead.)

Where preemption comes without a grace (GraceTime 0: SIGTERM, then SIGKILL after KillWait),
``--ckpt-every N`` checkpoints every N steps too. When Slurm then ends the run (``scontrol
requeue``, the preemption, the time limit, ``scancel``), that is one job event
(``job.watch_events``), not a failure per process: the call in flight raises a
SupervisionError whose reason is ``ENDED_BY_SLURM``, and

- if the job comes back (requeued): ``job.state()`` waits for it to run again, reconnects,
  and the new trainers resume from the checkpoint;
- if it does not (time limit, cancelled, preempted for good): the program says so, with
  the step the checkpoint holds, and exits 0. Run it again with the same ``--ckpt`` to
  resume.

The default ``unhandled_fault_hook`` stays in place: nothing here needs to replace it.
"""

import argparse
import os
import queue
import sys

from hpcmesh.actor import Actor, context, endpoint
from hpcmesh.job import SlurmJob
from hpcmesh.runtime.errors import ENDED_BY_SLURM, SupervisionError


class Trainer(Actor):
    """A stand-in for a model: its state is the step count and a running value; each rank
    keeps its checkpoint in ``<ckpt>/rank<N>.json`` (a shared filesystem)."""

    def __init__(self, ckpt: str):
        import json
        self.path = os.path.join(ckpt, f"rank{context().actor_instance.rank.rank}.json")
        self.step, self.value = 0, 0.0
        if os.path.exists(self.path):
            with open(self.path) as f:
                saved = json.load(f)
            self.step, self.value = saved["step"], saved["value"]

    @endpoint
    def train(self, steps: int, step_time: float) -> int:
        import time
        for _ in range(steps):
            time.sleep(step_time)                  # the forward/backward pass
            self.step += 1
            self.value = 0.9 * self.value + 1.0
        return self.step

    @endpoint
    def checkpoint(self) -> int:
        import json
        with open(self.path + ".tmp", "w") as f:
            json.dump({"step": self.step, "value": self.value}, f)
        os.replace(self.path + ".tmp", self.path)  # a run ended mid-write keeps the last one
        return self.step


def start(state, ckpt: str):
    """Processes and trainers on the job's current run; the step they resume from."""
    procs = state.trainers.spawn_procs(per_host={"gpus": 1})
    trainer = procs.spawn("trainer", Trainer, ckpt)
    step = min(trainer.train.call(0, 0.0).get(timeout=120).values())
    return trainer, step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", required=True, help="checkpoint folder (a shared filesystem)")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--chunk", type=int, default=2, help="steps per call")
    ap.add_argument("--ckpt-every", type=int, default=0,
                    help="also checkpoint every N steps (0: only on Slurm's notices); for "
                         "sites whose preemption gives no grace (GraceTime 0)")
    ap.add_argument("--step-time", type=float, default=0.25, help="seconds per step")
    ap.add_argument("--time", default="00:30:00", help="the job's time limit")
    ap.add_argument("--signal", default="USR1@90", help="Slurm's warning: SIG@seconds")
    ap.add_argument("--job-name", default="hpcmesh-requeue")
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args()
    os.makedirs(args.ckpt, exist_ok=True)

    job = SlurmJob(meshes={"trainers": args.nodes}, requeue=True, time_limit=args.time,
                   signal=args.signal, job_name=args.job_name, log_dir=args.log_dir)
    state = job.state(cached_path=None)
    print(f"job {job.job_id} running on {state.trainers.hostnames}", flush=True)

    notices: "queue.Queue" = queue.Queue()
    job.watch_notices(notices.put, interval=0.5)
    events: "queue.Queue" = queue.Queue()
    job.watch_events(events.put, interval=2.0)

    trainer, step = start(state, args.ckpt)
    print(f"starting at step {step}", flush=True)
    saved_at = step
    while step < args.steps:
        try:
            why = None
            while not notices.empty():             # Slurm's notice: checkpoint now
                notice = notices.get()
                if notice.get("restart", 0) == job.restart_count:      # (not a run's before)
                    why = f"Slurm's notice: {notice['signal']} on {notice['host']}"
            if why is None and args.ckpt_every and step - saved_at >= args.ckpt_every:
                why = f"every {args.ckpt_every} steps"
            if why:
                saved_at = min(trainer.checkpoint.call().get(timeout=60).values())
                print(f"checkpoint written at step {saved_at} ({why})", flush=True)
            step = min(trainer.train.call(args.chunk, args.step_time).get(
                timeout=600).values())
            print(f"step {step}", flush=True)
            continue
        except SupervisionError as e:
            if e.reason != ENDED_BY_SLURM:
                raise                              # a fault of the program's own
            print(f"training call failed ({e.exit_status}): {e}", flush=True)
        event = events.get(timeout=120)            # what happened to the job, in Slurm's words
        while event.kind == "running-again":
            event = events.get(timeout=120)
        print(f"job event: {event}", flush=True)
        if not event.comes_back:
            print(f"Slurm job {event.job_id} will not run again ({event.kind}); the checkpoint "
                  f"in {args.ckpt} holds what was saved: run this again to resume from it",
                  flush=True)
            return 0
        state = job.state(cached_path=None)        # waits in the queue, then reconnects
        trainer, step = start(state, args.ckpt)
        saved_at = step
        print(f"resumed from step {step} on {state.trainers.hostnames} "
              f"(restart {job.restart_count})", flush=True)
    trainer.checkpoint.call().get(timeout=60)
    print(f"done: {step} steps", flush=True)
    job.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
