#!/bin/bash
# Run an hpcmesh client inside its own allocation: it adopts the nodes it got.
#
#   sbatch -N4 sbatch/client_in_allocation.sh my_client.py [args...]
#   # (PYTHON=/path/to/venv/bin/python sbatch ... to pick the interpreter)
#
# The client runs here, on the first node of the allocation. In it,
#   hosts = hpcmesh.hosts.hosts_from_config()      # HPCMESH_HOSTS unset -> {"hosts": 4}
#   # or: hosts = hpcmesh.job.SlurmAllocation().state().hosts
# starts one host agent per node as an `srun --overlap` step of this job (no new
# job is queued), and the client drives actors on them. When the client exits, the
# step ends (a crashed client: HPCMESH_LEASE_GRACE seconds later) and so does the job.
#
#SBATCH --job-name=hpcmesh-client
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=01:00:00
#SBATCH --output=hpcmesh-client-%j.out
# Time-limit warning to every job step (no "B:"): the agents' step gets it and
# records it for actors (hpcmesh.job.slurm_notice()); the client is not killed by it.
#SBATCH --signal=USR1@90
##SBATCH --gpus-per-node=4          # each process of a "gpus" dimension gets one
##SBATCH --cpus-per-task=32         # passed on to the agents' srun explicitly
##SBATCH --partition=gpu
##SBATCH --account=myproject
##SBATCH --requeue                  # on preemption the whole job (client too) reruns

set -euo pipefail
PYTHON=${PYTHON:-python3}
if [ "$#" -lt 1 ]; then
    echo "usage: sbatch $0 client.py [args...]" >&2
    exit 2
fi
export HPCMESH_LEASE_GRACE=${HPCMESH_LEASE_GRACE:-30}
# unset HPCMESH_HOSTS            # keep it if it names a hosts file with scheduler: slurm
exec "$PYTHON" "$@"
