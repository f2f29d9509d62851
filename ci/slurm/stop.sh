#!/usr/bin/env bash
# Stops the slurmd and slurmctld that ci/slurm/start.sh started (by their pid files), cancelling
# every job first. munged is left running: other programs may use it.
set -uo pipefail
RUN_DIR=/run/daskann-slurm
command -v scancel >/dev/null && scancel --full --quiet --user "$(id -un)" 2>/dev/null
for name in slurmd slurmctld; do
  pid_file="$RUN_DIR/$name.pid"
  [ -f "$pid_file" ] || continue
  pid="$(cat "$pid_file")"
  kill "$pid" 2>/dev/null && echo "ci/slurm/stop.sh: stopped $name ($pid)" >&2
  rm -f "$pid_file"
done
