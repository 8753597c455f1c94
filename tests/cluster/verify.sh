#!/usr/bin/env bash
# End-to-end smoke test of a running test cluster (run after up.sh, as root).
# Prints one line per check with its wall time; exits non-zero on the first
# failure. Needs >= 3 nodes. Leaves no jobs behind.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VENV_PY=${VENV_PY:-$REPO/.venv/bin/python}
W=$(mktemp -d /tmp/hpcm-verify.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"

now() { date +%s%N; }
ms() { echo "$((($(now) - $1) / 1000000)) ms"; }
ok() { echo "OK   $*"; }
fail() { echo "FAIL $*" >&2; exit 1; }
wait_gone() { for _ in $(seq 600); do [[ -z $(squeue -h -j "$1" 2>/dev/null) ]] && return 0; sleep 0.05; done; return 1; }

"$HERE/status.sh" -q || fail "cluster not healthy: $("$HERE/status.sh" 2>&1 || true)"

# 1. 3-node batch job with srun + fake GPUs
cat >job.sh <<'EOF'
#!/bin/bash
srun hostname
srun --gpus-per-node=2 bash -c 'echo GPU $(hostname) $CUDA_VISIBLE_DEVICES $SLURM_GPUS_ON_NODE'
EOF
t=$(now)
id=$(sbatch --parsable -N3 --gpus-per-node=2 -o "$W/job.out" job.sh)
st=
for _ in $(seq 200); do
    st=$(squeue -h -j "$id" -o %T 2>/dev/null || true)
    [[ $st == RUNNING || -z $st ]] && break
    sleep 0.05
done
ok "sbatch -N3 job $id reached ${st:-done} after $(ms "$t")"
wait_gone "$id" || fail "job $id did not finish"
ok "job $id finished after $(ms "$t")"
for n in node1 node2 node3; do
    grep -qx "$n" job.out || fail "no '$n' in job output: $(cat job.out)"
    grep -qx "GPU $n 0,1 2" job.out || fail "no 'GPU $n 0,1 2' in job output: $(cat job.out)"
done
ok "output has node1..node3 and CUDA_VISIBLE_DEVICES=0,1 SLURM_GPUS_ON_NODE=2 on each"

# 2. salloc + srun --overlap
t=$(now)
out=$(timeout 60 salloc -N2 srun --overlap hostname 2>/dev/null | sort | tr '\n' ' ')
[[ $out == "node1 node2 " ]] || fail "salloc -N2 srun --overlap hostname gave '$out'"
ok "salloc -N2 srun --overlap hostname -> $out($(ms "$t"))"

# 3. TCP from a step on node2 to a listener on the login address, venv python
cat >listen.py <<'EOF'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.77.0.1", 0))
s.listen(1)
s.settimeout(30)
print(s.getsockname()[1], flush=True)
c, addr = s.accept()
print(c.recv(200).decode(), "from", addr[0], flush=True)
EOF
python3 listen.py >listen.out &
lpid=$!
for _ in $(seq 100); do [[ -s listen.out ]] && break; sleep 0.05; done
port=$(head -n1 listen.out)
t=$(now)
out=$(timeout 60 srun -N1 -w node2 "$VENV_PY" -c "
import socket, sys
c = socket.create_connection(('10.77.0.1', $port), timeout=5)
c.sendall(('hello from ' + socket.gethostname() + ' ' + sys.executable).encode())
print(socket.gethostname(), sys.executable)")
wait "$lpid"
grep -q "hello from node2 $VENV_PY from 10.77.0.12" listen.out || fail "listener got: $(cat listen.out)"
ok "srun -w node2 $VENV_PY -> TCP to 10.77.0.1:$port works ($out; $(ms "$t"))"

# 4. scancel kills a daemonized (setsid) grandchild
before=$(pgrep -xc sleep || true)
id=$(sbatch --parsable -N2 -o /dev/null --wrap \
    "srun bash -c 'setsid sleep 1000 </dev/null >/dev/null 2>&1 & sleep 1000'")
for _ in $(seq 200); do (($(pgrep -xc sleep || true) >= before + 4)) && break; sleep 0.05; done
(($(pgrep -xc sleep || true) >= before + 4)) || fail "job $id did not start its sleeps"
t=$(now)
scancel "$id"
for _ in $(seq 200); do (($(pgrep -xc sleep || true) <= before)) && break; sleep 0.05; done
(($(pgrep -xc sleep || true) <= before)) || fail "sleep processes survive scancel: $(pgrep -a sleep)"
ok "scancel $id left no daemonized sleep behind ($(ms "$t"))"
wait_gone "$id" || fail "job $id still listed"

# 5. job completion records
sacct -c -j "$id" -n -o jobid,state | grep -q CANCELLED || fail "sacct -c has no CANCELLED record for $id"
ok "sacct -c shows job $id CANCELLED"
echo "all checks passed"
