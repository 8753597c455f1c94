#!/usr/bin/env bash
# Install the Debian packages the test suite needs beyond the Slurm cluster's own
# (tests/cluster/up.sh installs slurmctld, slurmd, slurm-client, munge, iproute2, openssl).
# Needs root; installs only what is missing, so a second run costs a dpkg query.
#
#   openssh-server, openssh-client  tests/test_ssh_job.py runs a private sshd on 127.0.0.1
#   procps                          ps/pkill, used by the cluster scripts and by tests
#   python3-venv                    scripts/venv.sh (Debian's python3 lacks ensurepip)
#   chromium, chromium-driver       tests/test_dashboard.py renders the telemetry dashboard in
#                                   headless Chromium (through selenium and chromedriver)
#   fuse3                           fusermount3 and libfuse3 for remote_mount/gather_mount
#                                   (tests/test_mounts.py, tests/test_slurm_mounts.py)
set -euo pipefail
PKGS=(openssh-server openssh-client procps python3-venv chromium chromium-driver fuse3)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]})) || exit 0
echo "[system-packages] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends "${missing[@]}"; then
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
