"""daskann inside one SLURM allocation with dask-jobqueue's SLURMRunner.

Started by ``cluster/slurm-runner-example.sh`` as ``srun python cluster/slurm-runner-example.py``:
every SLURM task runs this file. ``SLURMRunner`` makes task 0 the scheduler, task 1 the client
(the code inside the ``with`` blocks) and every other task a worker; the workers find the
scheduler through a scheduler file in the submit folder, which all nodes must see. No worker jobs
are submitted: the allocation is the cluster, and it ends with the job (no walltime hand-over).

The tasks talk plain tcp:// inside the allocation; use the profile route (sbatch-example.sh)
for TLS. See cluster/README.md. ``DASKANN_SAMPLES``, ``DASKANN_HIDDEN`` and ``DASKANN_EPOCHS``
size the example's training (4000, "256,256" and 5); ``DASKANN_INTERFACE`` names the network
device the scheduler and workers listen on (default: the node's host name).
"""

from __future__ import annotations

import logging
import os

from dask.distributed import Client
from dask_jobqueue.slurm import SLURMRunner

from daskann import NPTTrainer
from daskann.cluster import blas_info, log_dashboard
from daskann.data import make_mnist1d

log = logging.getLogger("driver")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    scheduler_file = os.path.join(os.environ.get("SLURM_SUBMIT_DIR", "."), "daskann-scheduler-{job_id}.json")
    interface = {"interface": os.environ["DASKANN_INTERFACE"]} if os.environ.get("DASKANN_INTERFACE") else {}
    with (
        SLURMRunner(
            scheduler_file=scheduler_file,
            # one thread per worker, as daskann's own clusters; BLAS threads are set in the sbatch script
            worker_options={"nthreads": 1, "local_directory": os.environ.get("TMPDIR", "/tmp"), **interface},
            # the dashboard on the scheduler's node, loopback only: reach it with an SSH tunnel
            scheduler_options={"dashboard_address": "127.0.0.1:8787", **interface},
        ) as runner,
        Client(runner) as client,
    ):
        # only task 1 gets here; the other tasks serve as scheduler and workers until it returns
        client.wait_for_workers(runner.n_workers, timeout=600)
        log_dashboard(client)
        for worker, libs in sorted(blas_info(client).items()):
            log.info("%s BLAS %s", worker, libs)
        X, y = make_mnist1d(int(os.environ.get("DASKANN_SAMPLES", 4000)), seed=0)
        hidden = tuple(int(width) for width in os.environ.get("DASKANN_HIDDEN", "256,256").split(","))
        trainer = NPTTrainer(hidden, loss="cross_entropy", lr=0.05, client=client)
        trainer.fit(X, y, epochs=int(os.environ.get("DASKANN_EPOCHS", 5)))
        log.info("grid %s, final loss %.4f", trainer.grid_, float(trainer.history_["loss"][-1]))


if __name__ == "__main__":
    main()
