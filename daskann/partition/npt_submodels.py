"""Sub-models trained by the NPT trainer (Cannon's algorithm on the cluster's grid).

An NPT run spreads one network over every worker, so NPT sub-models run one
after another, each using the whole cluster; a run that raises is tried
again up to ``retries`` times.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from daskann import store
from daskann.cluster import current_client
from daskann.partition.submodels import SubModelResult, SubModelSpec


def run_npt_submodels(client, specs: list[SubModelSpec], data, *, retries: int, npt_options: dict):
    """Train each sub-model with :class:`daskann.NPTTrainer` on ``client``.

    Returns ``(results, failed)`` as :func:`daskann.partition.submodels.run_submodels`.
    """
    from daskann.npt import NPTTrainer  # the NPT engine loads on first use, as in trainer._npt_trainer_class

    results: list = [None] * len(specs)
    failed: dict = {}
    for spec in specs:
        for attempt in range(retries + 1):
            started = time.time()
            trainer = NPTTrainer(spec.hidden_sizes, client=client, **spec.trainer_arguments(), **npt_options)
            resume, resumed_from = None, 0
            if spec.checkpoint_dir is not None and store.list_checkpoints(spec.checkpoint_dir):
                resume = spec.checkpoint_dir
                resumed_from = store.load_checkpoint(resume).step
            t0 = time.perf_counter()
            try:
                # parts of the NPT engine look for the current client; make it this one
                with current_client(client):
                    trainer.fit(
                        data.X,
                        data.y,
                        steps=spec.steps,
                        validation_data=data.validation,
                        eval_every=spec.eval_every,
                        resume=resume,
                    )
            except Exception as exc:
                failed[spec.index] = exc
                continue
            failed.pop(spec.index, None)
            if spec.checkpoint_dir is not None:
                store.save_history(trainer.history_, Path(spec.checkpoint_dir) / store.HISTORY_STORE)
            results[spec.index] = SubModelResult(
                index=spec.index,
                seed=spec.seed,
                model=trainer.model_,
                history=trainer.history_,
                worker=",".join(sorted(set(trainer.grid_.workers))),
                host=socket.gethostname(),
                pid=os.getpid(),
                started=started,
                finished=time.time(),
                seconds=time.perf_counter() - t0,
                cpu_seconds=float("nan"),
                resumed_from=resumed_from,
                extra={
                    "grid": f"{trainer.grid_.rows}x{trainer.grid_.cols}",
                    "mode": trainer.mode_,
                    "attempts": attempt + 1,
                },
            )
            break
    return results, failed
