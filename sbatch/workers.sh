#!/bin/bash
# hpcmesh host agents in a batch job, for a client that attaches later.
#
#   sbatch -N4 sbatch/workers.sh                 # (PYTHON=/path/to/venv/bin/python sbatch ...)
#   # once running, from anywhere that reaches the nodes:
#   HPCMESH_HOSTS=.hpcmesh/workers-<jobid>/hosts.yaml \
#   HPCMESH_SECRET_FILE=.hpcmesh/workers-<jobid>/secret  python my_client.py
#   # where my_client.py does: hosts = hpcmesh.hosts.hosts_from_config()   -> {"hosts": 4}
#
# One agent per node listens on the node's chosen interface (IPoIB first; set
# HPCMESH_IFNAME to force one), writes its address to a ready file, and waits for a
# controller. Every connection is authenticated with the job secret (a 0600 file in
# the job folder). Agents exit once no controller has been connected for
# HPCMESH_LEASE_GRACE seconds (or if none connects within --initial-wait), so a
# forgotten job frees its nodes; the script ends when they do. To stop them now:
#   scancel --signal=HUP <jobid>     # agents stop their processes and exit; job COMPLETED
# (From a login node, hpcmesh.job.SlurmJob does all of this for you.)
#
#SBATCH --job-name=hpcmesh-workers
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=01:00:00
#SBATCH --output=hpcmesh-workers-%j.out
# Slurm's time-limit warning: to this shell, which passes it to the agents; they
# record it for actors (hpcmesh.job.slurm_notice()).
#SBATCH --signal=B:USR1@90
## GPUs: every agent sees all of its node's GPUs; a "gpus" mesh dimension gives one per process.
##SBATCH --gpus-per-node=4
##SBATCH --partition=gpu
##SBATCH --account=myproject

set -euo pipefail
PYTHON=${PYTHON:-python3}
JOB_DIR=${HPCMESH_JOB_DIR:-$PWD/.hpcmesh/workers-$SLURM_JOB_ID}
export HPCMESH_LEASE_GRACE=${HPCMESH_LEASE_GRACE:-300}
INITIAL_WAIT=${HPCMESH_INITIAL_WAIT:-900}   # seconds to wait for the first controller

umask 077
mkdir -p "$JOB_DIR"
if [ ! -s "$JOB_DIR/secret" ]; then
    "$PYTHON" -c 'import secrets; print(secrets.token_hex(32))' > "$JOB_DIR/secret"
fi
export HPCMESH_SECRET_FILE="$JOB_DIR/secret"
# Variables of this batch step that would confuse the nested srun.
unset SLURM_CPU_BIND SLURM_CPU_BIND_LIST SLURM_CPU_BIND_TYPE SLURM_CPU_BIND_VERBOSE

srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \
     --cpu-bind=none --kill-on-bad-exit=1 \
     "$PYTHON" -c 'from hpcmesh.job.slurm_agent import agent_main; agent_main()' \
     --job-dir "$JOB_DIR" --mesh hosts --initial-wait "$INITIAL_WAIT" &
srun_pid=$!
trap 'kill -s USR1 "$srun_pid" 2>/dev/null || true' USR1

# Once every agent wrote its ready file, write a hosts file (scheduler: static) for clients.
# Ready files are agent-<mesh>-r<requeue count>-<task id>.addr, one address per line.
restart=${SLURM_RESTART_COUNT:-0}
ready() { echo "$JOB_DIR/agent-hosts-r$restart-$1.addr"; }
all_ready=no
for _ in $(seq 3000); do
    missing=0
    for i in $(seq 0 $((SLURM_JOB_NUM_NODES - 1))); do
        [ -s "$(ready "$i")" ] || missing=$((missing + 1))
    done
    if [ "$missing" -eq 0 ]; then all_ready=yes; break; fi
    kill -0 "$srun_pid" 2>/dev/null || break
    sleep 0.2
done
if [ "$all_ready" = yes ]; then
    {
        echo "# hpcmesh workers of Slurm job $SLURM_JOB_ID (secret: $JOB_DIR/secret)"
        echo "scheduler: static"
        echo "workers:"
        for i in $(seq 0 $((SLURM_JOB_NUM_NODES - 1))); do
            echo "  - $(head -n1 "$(ready "$i")")"
        done
    } > "$JOB_DIR/hosts.yaml.tmp"
    mv "$JOB_DIR/hosts.yaml.tmp" "$JOB_DIR/hosts.yaml"
    echo "hpcmesh workers ready: HPCMESH_HOSTS=$JOB_DIR/hosts.yaml HPCMESH_SECRET_FILE=$JOB_DIR/secret"
else
    echo "hpcmesh workers: not every agent started; see the errors above" >&2
fi

# Wait for the agents; a trapped USR1 interrupts `wait`, so wait again.
while :; do
    rc=0
    wait "$srun_pid" || rc=$?
    if [ "$rc" -gt 128 ] && kill -0 "$srun_pid" 2>/dev/null; then continue; fi
    exit "$rc"
done
