#!/usr/bin/env bash
# Install what tests/slurm/start.sh needs: Debian/Ubuntu's SLURM (22.05 on Debian 12) and munge.
# Needs root and the package registry. Daemons are not started here (no systemd in containers);
# start them with tests/slurm/start.sh STATE_DIR. About 10 s on Debian 12.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "slurm-install: must run as root" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge
# the munge package creates the key on install; make sure it exists and has the right owner
[ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
chown munge:munge /etc/munge/munge.key && chmod 600 /etc/munge/munge.key
slurmctld -V
