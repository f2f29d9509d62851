#!/usr/bin/env bash
# daskann on SLURM: this small "driver" job runs the client and the Dask scheduler; the
# `slurm` profile (cluster/slurm.yaml) submits the worker jobs, which connect back over TLS.
#
#   sbatch cluster/sbatch-example.sh                 # edit the #SBATCH lines and VENV first
#   DASKANN_JOBS=4 sbatch cluster/sbatch-example.sh  # 4 worker jobs instead of the profile's scale
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

# Either the command line (method commands take --profile / --address / --workers):
#   daskann train npt --profile slurm --workers "${DASKANN_JOBS:-2}" --output "runs/npt-$SLURM_JOB_ID"
# or Python, as below.
python - <<'PY'
import logging
import os

from daskann.cluster import blas_info, client, close

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
log = logging.getLogger("driver")


def main():
    jobs = int(os.environ["DASKANN_JOBS"]) if os.environ.get("DASKANN_JOBS") else None
    c = client(profile="slurm", n_workers=jobs)  # logs the dashboard link
    try:
        log.info("scheduler %s on %s", c.scheduler.address, os.uname().nodename)
        c.wait_for_workers(1, timeout=3600)  # worker jobs may queue for a while
        for worker, libs in sorted(blas_info(c).items()):
            log.info("%s BLAS %s", worker, libs)

        from daskann.data import make_mnist1d
        from daskann import NPTTrainer  # or MGRITTrainer, PartitionTrainer

        X, y = make_mnist1d(4000, seed=0)
        trainer = NPTTrainer((256, 256), loss="cross_entropy", lr=0.05, client=c)
        trainer.fit(X, y, epochs=5)
        log.info("final loss %.4f", float(trainer.history_["loss"][-1]))
    finally:
        close(c)  # cancels the worker jobs too


if __name__ == "__main__":
    main()
PY
