#!/usr/bin/env bash
# daskann on SLURM: this small "driver" job runs the client and the Dask scheduler; the
# `slurm` profile (cluster/slurm.yaml) submits the worker jobs, which connect back over TLS.
#
#   sbatch cluster/sbatch-example.sh                 # edit the #SBATCH lines and VENV first
#   DASKANN_JOBS=4 sbatch cluster/sbatch-example.sh  # 4 worker jobs instead of the profile's scale
#
# Runs longer than one allocation: the run folder keeps a checkpoint every 100 steps and this
# script continues the run it finds there (--resume), so a second job queued behind the first
# takes over where the first one's walltime stopped it (cluster/README.md, "Runs longer than an
# allocation"):
#   first=$(sbatch --parsable cluster/sbatch-example.sh)
#   sbatch --dependency=afterany:"$first" cluster/sbatch-example.sh
#
# Needs: daskann with the hpc extra (dask-jobqueue, cryptography) in a virtualenv on a
# filesystem the compute nodes share, and sbatch usable from inside a job (most sites allow it).
# Dashboard: see cluster/README.md (SSH tunnel to the node named in the log).
#SBATCH --job-name=daskann-driver
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=2
#SBATCH --mem=4G
#SBATCH --time=01:30:00
#SBATCH --output=daskann-driver-%j.log
##SBATCH --partition=compute
##SBATCH --account=myproject

set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$PWD}"
VENV="${VENV:-$PWD/.venv}"
# shellcheck disable=SC1091
source "$VENV/bin/activate"

# the driver does little numeric work: keep its BLAS on one thread too
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

PROFILE="${DASKANN_PROFILE:-slurm}"       # a shipped profile's name or your site's YAML file
RUN="${DASKANN_RUN:-runs/npt-example}"    # the run folder: checkpoints, history, model
# the training; any `daskann train npt` options (see `daskann train npt --help`)
read -r -a TRAINING <<<"${DASKANN_TRAINING:---dataset mnist1d --hidden 256,256 --loss cross_entropy --epochs 5}"

if [ -e "$RUN/model.zarr" ]; then
  echo "driver job ${SLURM_JOB_ID:-?}: the run in $RUN is complete, nothing left to train"
  exit 0
fi
resume=()
if [ -f "$RUN/daskann-run.json" ]; then
  resume=(--resume)   # an earlier job of this chain started the run: continue it from its last checkpoint
  last="$(find "$RUN/checkpoints" -maxdepth 1 -name 'step-*.zarr' 2>/dev/null | sort | tail -n 1)"
  echo "driver job ${SLURM_JOB_ID:-?}: resuming from ${last:-the start}"
fi
workers=()
if [ -n "${DASKANN_JOBS:-}" ]; then
  workers=(--workers "$DASKANN_JOBS")
fi

echo "driver job ${SLURM_JOB_ID:-?} on $(hostname): run $RUN ${resume[*]}"
# waits for the worker jobs (daskann.cluster.worker-wait), keeps their number as they reach their
# walltime, and cancels them when the training ends
daskann train npt --profile "$PROFILE" "${workers[@]}" "${TRAINING[@]}" \
  --checkpoint-every "${DASKANN_CHECKPOINT_EVERY:-100}" --output "$RUN" "${resume[@]}" --json
