#!/usr/bin/env bash
# daskann in one SLURM allocation: dask-jobqueue's SLURMRunner turns the job's tasks into a Dask
# cluster (task 0: scheduler, task 1: the client running the training, the rest: workers).
#
#   sbatch cluster/slurm-runner-example.sh          # edit the #SBATCH lines and VENV first
#
# 6 tasks = scheduler + client + 4 workers. Unlike sbatch-example.sh, no worker jobs are submitted
# (for sites that forbid sbatch inside jobs); the cluster lives as long as this job.
#SBATCH --job-name=daskann-runner
#SBATCH --ntasks=6
#SBATCH --cpus-per-task=1
#SBATCH --mem-per-cpu=4G
#SBATCH --time=01:00:00
#SBATCH --output=daskann-runner-%j.log
##SBATCH --nodes=2
##SBATCH --partition=compute
##SBATCH --account=myproject

set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$PWD}"
VENV="${VENV:-$PWD/.venv}"
# shellcheck disable=SC1091
source "$VENV/bin/activate"

# one BLAS thread per task: each worker is one process of one thread
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 VECLIB_MAXIMUM_THREADS=1 NUMEXPR_NUM_THREADS=1

srun python cluster/slurm-runner-example.py
