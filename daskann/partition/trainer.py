"""PartitionTrainer: k sub-models as futures, merged on the client, then fine-tuned."""

from __future__ import annotations

import contextlib
import math
import shutil
import time
import uuid
from pathlib import Path
from typing import get_args

import numpy as np
import xarray as xr
from distributed import Client

from daskann import store
from daskann._base import CHECKPOINT_DIR, BaseTrainer, constructor_arguments
from daskann._dask_input import is_dask_array, materialize, remote_call
from daskann._history import HistoryRecorder
from daskann._json import read_json, write_json
from daskann._options import OptionGroup, resolve_group
from daskann._validation import (
    Activation,
    Combine,
    Loss,
    PartitionMode,
    SubTrainer,
    check_choice,
    check_float,
    check_int,
    invalid,
)
from daskann.cluster import check_worker_memory, current_client
from daskann.exceptions import SubModelError
from daskann.nn import MLP
from daskann.partition.diversity import submodel_diversity
from daskann.partition.merge import check_combine, check_noise, merge_submodels
from daskann.partition.split import Partition, check_hidden_k, split_network
from daskann.partition.submodels import (
    SHARED_SETTINGS,
    SubModelSpec,
    merge_seed,
    run_npt_submodels,
    run_submodels,
    submodel_dir,
    submodel_seeds,
)
from daskann.serial import SerialTrainer

MODES = get_args(PartitionMode)
SUB_TRAINERS = get_args(SubTrainer)
PHASES = ("submodel", "merge", "finetune")
_STATE = "partition"  # folder of a run's partition state


class PartitionSplitOptions(OptionGroup):
    """The ``split`` options of :class:`PartitionTrainer`: how the ``k`` sub-models train.

    Given as ``split=PartitionSplitOptions(...)`` or a dict of the same
    keywords (``split={"sub_steps": 100}``); either way
    ``trainer.set_params(split__sub_steps=100)`` sets one option.

    Parameters
    ----------
    sub_steps, sub_epochs : int, optional
        Training length of each sub-model (at most one of the two); by default
        as long as the fine-tuning.
    mode : {"parallel", "sequential"}
        Sub-models all at once (one future each) or one after another.
    sub_trainer : {"serial", "npt"}
        Trainer of the sub-models: the serial trainer inside one task per
        sub-model, or :class:`daskann.NPTTrainer`, which spreads each
        sub-model over every worker (so it needs ``mode="sequential"``).
    npt_options : dict, optional
        Extra keyword arguments of every :class:`daskann.NPTTrainer` of the
        run (NPT sub-models, NPT fine-tuning).
    retries : int
        Extra attempts of a sub-model task that raises (a worker that dies
        is handled by the scheduler, which reruns the task elsewhere).
    timeout : float
        Seconds the sub-model phase may take before it is cancelled.
    """

    group = "split"

    def __init__(
        self,
        *,
        sub_steps=None,
        sub_epochs=None,
        mode: PartitionMode = "parallel",
        sub_trainer: SubTrainer = "serial",
        npt_options=None,
        retries=2,
        timeout=3600.0,
    ):
        self._store(locals())


class PartitionMergeOptions(OptionGroup):
    """The ``merge`` options of :class:`PartitionTrainer`: the merged network and its fine-tuning.

    Given as ``merge=PartitionMergeOptions(...)`` or a dict of the same
    keywords (``merge={"noise": 0.0}``).

    Parameters
    ----------
    combine : {"mean", "sum"}
        Output layer of the merge: the mean (weights over ``k``, mean of the
        biases) or the sum of the sub-models' logits.
    noise : float
        Uniform merge noise relative to each parameter array's largest
        absolute value (the paper uses 0.02); 0 for an exact merge.
    finetune_trainer : {"serial", "npt"}, optional
        Trainer of the merged network; ``None`` means as the split's
        ``sub_trainer``.
    """

    group = "merge"

    def __init__(self, *, combine: Combine = "mean", noise=0.02, finetune_trainer: SubTrainer | None = None):
        self._store(locals())


class PartitionTrainer(BaseTrainer):
    """Partitioned pre-training (Miranda and Von Zuben, arXiv:1511.02954).

    Each hidden layer's units are cut into ``k`` groups; sub-model ``g`` is
    the network made of group ``g`` of every hidden layer with the full input
    and output layers. The ``k`` sub-models train independently, as one Dask
    future each (``mode="parallel"``) or one after another
    (``mode="sequential"``), each from its own seed derived from ``seed``.
    The client merges them into the block-diagonal initialisation of the full
    network (:func:`daskann.partition.merge_submodels`: cross-group weights
    zero, output layer combined by ``combine``, uniform noise, momentum reset
    to zero) and fine-tunes it with the serial trainer.

    Parameters
    ----------
    hidden_sizes : sequence of int
        Hidden widths of the full network; each must have at least ``k`` units.
    activation, loss, lr, batch_size, epochs, steps, seed, verbose, network, sgd
        As :class:`daskann.SerialTrainer`; sub-models and fine-tuning share them.
    checkpoint : path, dict or CheckpointOptions, optional
        The run folder (``dir``): fine-tuning checkpoints in ``checkpoints/`` (as the serial
        trainer), each sub-model's checkpoints and history in
        ``partition/submodel-<g>/``, the merge record in ``partition/``.
        ``fit(resume=...)`` skips finished sub-models and continues the
        unfinished ones and the fine-tuning from their last checkpoints;
        ``every``: checkpoint every this many steps in every phase.
    k : int
        Number of sub-models, from 2 to the narrowest hidden layer.
    split : dict or PartitionSplitOptions, optional
        How the sub-models train: ``sub_steps`` or ``sub_epochs`` (their
        length; by default the fine-tuning's), ``mode`` (``"parallel"``, one
        future each, or ``"sequential"``), ``sub_trainer`` (``"serial"`` or
        ``"npt"``), ``npt_options``, ``retries`` and ``timeout``; see
        :class:`PartitionSplitOptions`. ``set_params(split__mode="sequential")``
        sets one option.
    merge : dict or PartitionMergeOptions, optional
        How the sub-models become the full network and train on: ``combine``
        (``"mean"`` or ``"sum"`` of the output layers), ``noise`` (0.02, the
        paper's) and ``finetune_trainer``; see :class:`PartitionMergeOptions`.
    client : distributed.Client, optional
        Default: the current client, else an embedded LocalCluster.

    Attributes
    ----------
    model_ : MLP
        The fine-tuned full network.
    merged_model_ : MLP
        The merged network before fine-tuning.
    submodels_ : list of MLP
        The trained sub-models (``None`` for one that failed).
    submodel_results_ : list of SubModelResult
        Sub-models with worker, wall-clock start and stop, and history.
    submodel_history_ : xarray.Dataset
        Sub-model histories over ``(submodel, step)``.
    history_ : xarray.Dataset
        The run's timeline over ``step``, with ``phase`` ("submodel",
        "merge", "finetune") and ``phase_step`` (the step within its phase).
        Rows ``1..S`` summarise the sub-models (mean loss and validation
        figures; ``time`` when every sub-model had done that step), row
        ``S + 1`` is the merged network, rows ``S + 1 + j`` are fine-tuning
        step ``j``. ``time`` counts from the start of the fit.
    diversity_ : dict
        Pairwise diversity of the sub-models on the validation data (see
        :func:`daskann.partition.submodel_diversity`); ``None`` without
        validation data.
    timings_ : dict
        Seconds per phase: ``submodel`` (wall time of the futures, data
        scatter included), ``merge``, ``finetune``, ``total``;
        ``submodel_each`` (training time of each sub-model) and the CPU time
        of the training threads, ``submodel_cpu_each`` and ``finetune_cpu``
        (what the phases cost without other load on the machine).
    partition_ : Partition
    seeds_ : list of int
        The sub-models' seeds.
    sub_steps_ : int
        Training steps of each sub-model.
    velocity_, n_steps_, batch_order_
        Optimiser state, fine-tuning steps and batch order of the full network.

    Examples
    --------
    >>> from daskann.data import load_digits
    >>> X, y = load_digits()
    >>> trainer = PartitionTrainer((64, 64), loss="cross_entropy", lr=0.1, k=2, merge={"noise": 0.0})
    >>> trainer.fit(X, y, steps=100, validation_data=(X, y))  # doctest: +SKIP
    """

    method = "partition"
    _reads_dask = True  # dask-array data is checked and read on the workers
    _option_groups = {**BaseTrainer._option_groups, "split": PartitionSplitOptions, "merge": PartitionMergeOptions}

    def __init__(
        self,
        hidden_sizes=(64,),
        *,
        activation: Activation = "relu",
        loss: Loss = "mse",
        lr=0.01,
        batch_size=32,
        epochs=10,
        steps=None,
        seed=0,
        verbose=0,
        network=None,
        sgd=None,
        checkpoint=None,
        k=2,
        split=None,
        merge=None,
        client=None,
    ):
        self._store_params(locals())

    # -- checks -------------------------------------------------------------
    def _check_settings(self, eval_every=None) -> dict:
        s = super()._check_settings(eval_every)
        s["k"] = check_hidden_k(self.k, s["hidden_sizes"])
        s.update(self._check_groups())
        if self.client is not None:
            if not isinstance(self.client, Client):
                raise invalid("client", type(self.client).__name__, "a distributed.Client or None", TypeError)
        return s

    def _check_groups(self) -> dict:
        """The options of ``split`` and ``merge``, checked (errors name an option as given: ``split['mode']``)."""
        split = resolve_group(self.split, PartitionSplitOptions)
        merge = resolve_group(self.merge, PartitionMergeOptions)
        split_name, merge_name = PartitionSplitOptions.name_of, PartitionMergeOptions.name_of
        s = {
            "combine": check_combine(merge["combine"], merge_name("combine")),
            "noise": check_noise(merge["noise"], merge_name("noise")),
        }
        s["mode"] = check_choice(split_name("mode"), split["mode"], MODES)
        s["sub_trainer"] = check_choice(split_name("sub_trainer"), split["sub_trainer"], SUB_TRAINERS)
        finetune = merge["finetune_trainer"]
        s["finetune_trainer"] = (
            s["sub_trainer"]
            if finetune is None
            else check_choice(merge_name("finetune_trainer"), finetune, SUB_TRAINERS)
        )
        sub_steps, sub_epochs = split["sub_steps"], split["sub_epochs"]
        if sub_steps is not None and sub_epochs is not None:
            raise invalid("split", self.split, "at most one of 'sub_steps' and 'sub_epochs'")
        s["sub_steps"] = None if sub_steps is None else check_int(split_name("sub_steps"), sub_steps)
        s["sub_epochs"] = None if sub_epochs is None else check_int(split_name("sub_epochs"), sub_epochs)
        s["retries"] = check_int(split_name("retries"), split["retries"], minimum=0)
        s["timeout"] = check_float(split_name("timeout"), split["timeout"], minimum=0.0, min_inclusive=False)
        if split["npt_options"] is not None and not isinstance(split["npt_options"], dict):
            raise invalid(
                split_name("npt_options"),
                split["npt_options"],
                "a dict of NPTTrainer keyword arguments or None",
                TypeError,
            )
        for name, group_name in (("sub_trainer", split_name), ("finetune_trainer", merge_name)):
            if s[name] == "npt":
                _npt_trainer_class(group_name(name))  # fails here, before any task, if it is missing
        if s["sub_trainer"] == "npt" and s["mode"] == "parallel":
            raise invalid(
                split_name("mode"),
                s["mode"],
                "'sequential' with sub_trainer='npt': an NPT sub-model already "
                "spreads over every worker, so NPT sub-models run one after another",
            )
        # kept apart from the settings: a dict, not a setting of the history's attributes
        self._npt_options = dict(split["npt_options"] or {})
        return s

    def _training_config(self, settings) -> dict:
        config = super()._training_config(settings)
        config.update({"k": settings["k"], "combine": settings["combine"], "noise": settings["noise"]})
        return config

    def _history_attrs(self, settings) -> dict:
        attrs = super()._history_attrs(settings)
        attrs.pop("timeout", None)
        return attrs

    # -- training -----------------------------------------------------------
    def fit(self, X, y, *, steps=None, epochs=None, validation_data=None, eval_every=None, resume=None):
        """Train the sub-models, merge them and fine-tune the full network.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like
            Targets for ``"mse"`` (any real numbers), class labels for
            ``"cross_entropy"`` (any hashable values, kept in ``classes_``).
        steps, epochs : int, optional
            Fine-tuning length for this call, at most one of the two; by default
            the trainer's ``steps`` or ``epochs`` (also the sub-models' length
            unless ``split`` sets ``sub_steps`` or ``sub_epochs``).
        validation_data : (X_val, y_val), optional
            Evaluated every ``eval_every`` steps in every phase; the sub-models'
            diversity is measured on it.
        eval_every : int, optional
            Validation every this many steps (and at the end); by default once
            per epoch.
        resume : path, optional
            A run folder written with ``checkpoint``: finished sub-models
            are loaded, unfinished ones and the fine-tuning continue.

        Returns
        -------
        self

        Raises
        ------
        SubModelError
            A sub-model failed for good; the others are kept in ``submodels_``.
        """
        settings, data, total, sub_total, partition, run_dir = self._prepare(
            X, y, steps, epochs, validation_data, resume, fine_tune=True, eval_every=eval_every
        )

        t_start = time.perf_counter()
        wall_start = time.time()
        with self._client() as client, self._claim_run_dir(run_dir):
            results = self._train_submodels(client, settings, data, partition, sub_total, run_dir)
            t_sub = time.perf_counter()
            self.timings_["submodel"] = t_sub - t_start
            merged = self._merge(settings, partition, results)
            self.timings_["merge"] = time.perf_counter() - t_sub
            merge_values = self._evaluate(merged, data.validation, settings["loss"])
            self._record_pretrain(results, merge_values, wall_start, sub_total)
            self._finetune_offset = time.perf_counter() - t_start
            t_fine, c_fine = time.perf_counter(), time.thread_time()
            self._finetune(client, settings, data, merged, total, run_dir)
        self.timings_["finetune"] = time.perf_counter() - t_fine
        self.timings_["finetune_cpu"] = time.thread_time() - c_fine
        self.timings_["total"] = time.perf_counter() - t_start
        self._measure_diversity(settings, data)
        self.history_.attrs.update(self._run_attrs())
        return self

    def fit_submodels(self, X, y, *, steps=None, epochs=None, validation_data=None, eval_every=None):
        """Only the first phase: train the ``k`` sub-models, without merging or fine-tuning.

        Sets ``submodels_``, ``submodel_results_``, ``submodel_history_``,
        ``diversity_``, ``partition_``, ``seeds_`` and ``timings_["submodel"]``;
        :func:`daskann.partition.merge_submodels` merges the result.

        Parameters
        ----------
        X, y, validation_data, eval_every
            As :meth:`fit`.
        steps, epochs : int, optional
            Length of each sub-model; by default ``split``'s ``sub_steps`` or ``sub_epochs``, else the
            trainer's ``steps`` or ``epochs``.

        Returns
        -------
        self
        """
        settings, data, _, sub_total, partition, run_dir = self._prepare(
            X, y, steps, epochs, validation_data, None, fine_tune=False, eval_every=eval_every
        )

        t_start = time.perf_counter()
        with self._client() as client, self._claim_run_dir(run_dir):
            self._train_submodels(client, settings, data, partition, sub_total, run_dir)
        self.timings_["submodel"] = time.perf_counter() - t_start
        self._measure_diversity(settings, data)
        return self

    def _prepare(self, X, y, steps, epochs, validation_data, resume, *, fine_tune: bool, eval_every=None):
        """Every check, before any task: settings, data, lengths, split, run folder."""
        settings = self._check_settings(eval_every)
        data = self._check_data(X, y, validation_data, settings)
        order = self._batch_order(settings, data.n_samples)
        total = None
        if fine_tune:
            total = self._check_length(steps, epochs, order.steps_per_epoch)
            if settings["sub_epochs"] is not None:
                sub_total = settings["sub_epochs"] * order.steps_per_epoch
            else:
                sub_total = settings["sub_steps"] or total
        elif steps is None and epochs is None and (settings["sub_steps"] or settings["sub_epochs"]) is not None:
            sub_total = settings["sub_steps"] or settings["sub_epochs"] * order.steps_per_epoch
        else:
            sub_total = self._check_length(steps, epochs, order.steps_per_epoch)
        sizes = (data.n_features, *settings["hidden_sizes"], data.n_outputs)
        partition = split_network(sizes, settings["k"])
        # the sub-models together hold fewer parameters than the full network: an upper bound
        self._check_checkpoint_space(settings, sizes, 0, total or 0, extra_steps=sub_total)
        run_dir = self._check_run_dir(resume, settings, partition, sub_total)
        self._keep_inputs(settings, data, order)
        self.partition_ = partition
        self.sub_steps_ = sub_total
        self.seeds_ = submodel_seeds(settings["seed"], partition.k)
        self.timings_ = {}
        for name in (
            "model_",
            "submodels_",
            "submodel_results_",
            "submodel_history_",
            "diversity_",
            "merged_model_",
            "history_",
        ):
            self.__dict__.pop(name, None)
        return settings, data, total, sub_total, partition, run_dir

    def _measure_diversity(self, settings, data) -> None:
        # measured after the timeline: diversity is a report, not part of the method's cost
        self.diversity_ = None
        if data.validation is not None:
            task = "classification" if settings["loss"] == "cross_entropy" else "regression"
            if is_dask_array(data.validation[0]):  # measured on a worker, where the validation data lives
                self.diversity_ = remote_call(submodel_diversity, self.submodels_, data.validation[0], task=task)
            else:
                self.diversity_ = submodel_diversity(self.submodels_, data.validation[0], task=task)

    def _check_run_dir(self, resume, settings, partition: Partition, sub_total: int) -> Path | None:
        """Validate ``resume`` or a fresh checkpoint folder; nothing is written yet."""
        record = {
            "partition": partition.to_dict(),
            "combine": settings["combine"],
            "noise": settings["noise"],
            "seed": settings["seed"],
            "sub_steps": sub_total,
            "sub_trainer": settings["sub_trainer"],
        }
        self.__dict__.pop("_fresh_record", None)
        if resume is not None:
            if not isinstance(resume, (str, Path)):
                raise invalid("resume", resume, "a run folder path", TypeError)
            run_dir = Path(resume)
            if self._checkpoint_dir is not None and Path(self._checkpoint_dir).resolve() != run_dir.resolve():
                raise invalid("resume", str(resume), f"the run folder {CHECKPOINT_DIR}={str(self._checkpoint_dir)!r}")
            store.RunLock(run_dir).check_free("resume")
            found = read_json(run_dir / _STATE, "config.json", name="resume")
            if found is None:
                raise store.StoreError(
                    f"resume={str(resume)!r} is not a partition run folder (no {_STATE}/config.json)"
                )
            if found != record:
                changed = sorted(key for key in record if found.get(key) != record[key])
                raise store.StoreError(
                    f"resume={str(resume)!r} was run with other settings: {', '.join(changed)} differ"
                )
            return run_dir
        if self._checkpoint_dir is None:
            return None
        run_dir = Path(self._checkpoint_dir)
        if (run_dir / store.CHECKPOINT_DIR).is_dir() and store.list_checkpoints(run_dir):
            raise invalid(CHECKPOINT_DIR, str(run_dir), "a folder without checkpoints (pass resume to continue it)")
        self._fresh_record = record  # written by _claim_run_dir, under the run lock
        return run_dir

    @contextlib.contextmanager
    def _claim_run_dir(self, run_dir: Path | None):
        """Hold the run folder's lock for the fit; a fresh run starts its state folder under it."""
        if run_dir is None:
            yield
            return
        with store.RunLock(run_dir):
            record = self.__dict__.pop("_fresh_record", None)
            if record is not None:
                # a fresh run: stale sub-model checkpoints must not be resumed by the tasks
                shutil.rmtree(run_dir / _STATE, ignore_errors=True)
                (run_dir / _STATE).mkdir(parents=True, exist_ok=True)
                write_json(record, run_dir / _STATE / "config.json", indent=2)
            yield

    def _train_submodels(self, client, settings, data, partition, sub_total, run_dir):
        specs = self._submodel_specs(settings, partition, sub_total, run_dir)
        prefix = f"daskann-partition-{uuid.uuid4().hex[:12]}"
        self.run_prefix_ = prefix
        bar = self._progress_bar(partition.k, "partition sub-models", unit="sub-model").start()
        if settings["sub_trainer"] == "npt":
            results, failed = run_npt_submodels(
                client,
                specs,
                data,
                retries=settings["retries"],
                npt_options=self._npt_options,
            )
        else:
            results, failed = self._run_serial_submodels(client, settings, data, specs, prefix, bar)
        # every sub-model has finished or failed; done-callbacks may lag, and NPT sub-models have none
        bar.update(partition.k)
        bar.close()
        self.submodel_results_ = results
        self.submodels_ = [None if r is None else r.model for r in results]
        self.timings_["submodel_each"] = [None if r is None else r.seconds for r in results]
        self.timings_["submodel_cpu_each"] = [None if r is None else r.cpu_seconds for r in results]
        if failed:
            raise SubModelError(failed, results, attempts=settings["retries"] + 1)
        self.submodel_history_ = xr.concat(
            [r.history for r in results], dim="submodel", join="outer", combine_attrs="drop_conflicts"
        ).assign_coords(submodel=np.arange(partition.k))
        return results

    def _submodel_specs(self, settings, partition, sub_total, run_dir) -> list[SubModelSpec]:
        """What each sub-model's task trains: its widths, seed, shared settings, length and folder."""
        shared = _shared_settings(settings)
        return [
            SubModelSpec(
                index=g,
                hidden_sizes=partition.submodel_sizes(g)[1:-1],
                seed=self.seeds_[g],
                settings=shared,
                steps=sub_total,
                eval_every=settings["eval_every"],
                checkpoint_dir=None if run_dir is None else str(submodel_dir(run_dir, g)),
                checkpoint_every=settings["checkpoint_every"],
            )
            for g in range(partition.k)
        ]

    def _run_serial_submodels(self, client, settings, data, specs, prefix, bar):
        """Serial-trainer sub-models as tasks on the workers, each holding a copy of the data.

        Returns ``(results, failed)`` as :func:`daskann.partition.submodels.run_submodels`.
        """
        validation = data.validation
        # every worker gets all of the data: refuse before scattering if it cannot hold it
        check_worker_memory(client, data.X.nbytes + data.y.nbytes + sum(a.nbytes for a in (validation or ())), name="X")
        # the data goes to every worker once: tasks get futures, never closures over arrays
        scattered = []

        def scatter():
            if scattered:  # a rerun after every copy died: nannies may still be bringing workers back
                client.wait_for_workers(1, timeout=settings["timeout"])
            if is_dask_array(data.X):
                X_f, y_f, val_f = _shared_copies(client, data, f"{prefix}-data-{len(scattered)}")
            else:
                X_f, y_f = client.scatter([data.X, data.y], broadcast=True, hash=False)
                val_f = (
                    None if validation is None else tuple(client.scatter(list(validation), broadcast=True, hash=False))
                )
            scattered.extend([X_f, y_f, *(val_f or ())])
            return X_f, y_f, val_f

        try:
            results, failed = run_submodels(
                client,
                specs,
                scatter(),
                mode=settings["mode"],
                prefix=prefix,
                retries=settings["retries"],
                timeout=settings["timeout"],
                rescatter=scatter,
                watch=_advance_when_done(bar),
            )
        finally:
            client.cancel(scattered)
        return results, failed

    def _merge(self, settings, partition, results) -> MLP:
        """The full network merged from the sub-models (a copy kept as ``merged_model_``)."""
        merged = merge_submodels(
            partition,
            [r.model for r in results],
            combine=settings["combine"],
            noise=settings["noise"],
            seed=merge_seed(settings["seed"]),
        )
        self.merged_model_ = merged.copy()
        return merged

    def _record_pretrain(self, results, merge_values, wall_start, sub_total):
        """Rows of the sub-model phase (summaries over sub-models) and of the merge."""
        recorder = HistoryRecorder("step")
        steps = np.arange(1, sub_total + 1)
        stacks = {}
        for name in ("loss", "time", "val_loss", "val_accuracy"):
            columns = []
            for r in results:
                h = r.history
                values = np.full(sub_total, np.nan)
                if name in h:
                    where = h["step"].values.astype(np.int64) - 1
                    ok = (where >= 0) & (where < sub_total)
                    values[where[ok]] = h[name].values[ok]
                if name == "time":
                    # the worker's clock: when this sub-model had done the step, from the fit's start
                    offset = min(max(r.started - wall_start, 0.0), self.timings_["submodel"])
                    values = values + offset
                columns.append(values)
            stacks[name] = np.vstack(columns)
        times = _nan_reduce(stacks["time"], np.max)
        for i, step in enumerate(steps):
            row = {
                "phase": "submodel",
                "phase_step": int(step),
                "loss": _nan_reduce(stacks["loss"][:, i], np.mean),
                "time": times[i],
            }
            for name in ("val_loss", "val_accuracy"):
                value = _nan_reduce(stacks[name][:, i], np.mean)
                if not math.isnan(value):
                    row[name] = value
            recorder.append(int(step), **row)
        # the merged network exists once the merge is done; its evaluation is not part of the merge
        recorder.append(
            sub_total + 1,
            phase="merge",
            phase_step=0,
            time=self.timings_["submodel"] + self.timings_["merge"],
            **merge_values,
        )
        self._pretrain = recorder
        self._pretrain_steps = sub_total + 1

    def _finetune(self, client, settings, data, merged: MLP, total, run_dir):
        trainer = self._make_finetuner(client, settings, run_dir)
        resume = None
        if run_dir is not None and store.list_checkpoints(run_dir):
            resume = store.find_checkpoint(run_dir)  # a checkpoint store: its own history is not replayed
        start = {"resume": resume} if resume is not None else {"init_model": merged}
        fit_kwargs = {"steps": total, "eval_every": settings["eval_every"], **start}
        try:
            # the NPT engine looks for the current client in places; make it this one
            with current_client(client):
                if is_dask_array(data.X) and not trainer._reads_dask and run_dir is None:
                    # serial fine-tuning of dask-array data runs on a worker, where the data is read (with a
                    # run folder it runs here: the folder's lock belongs to this process)
                    trainer = remote_call(_fit_on_worker, trainer, data.X, data.y, data.validation, fit_kwargs)
                else:
                    trainer.fit(data.X, data.y, validation_data=data.validation, **fit_kwargs)
        finally:
            self._finetuner = trainer
            if hasattr(trainer, "model_"):
                self._keep_finetuned(trainer)

    def _make_finetuner(self, client, settings, run_dir):
        kwargs = constructor_arguments(
            _shared_settings(settings),
            seed=settings["seed"],
            verbose=self.verbose,
            checkpoint_dir=run_dir,
            checkpoint_every=settings["checkpoint_every"],
        )
        if settings["finetune_trainer"] == "npt":
            npt_class = _npt_trainer_class("finetune_trainer")
            return npt_class(settings["hidden_sizes"], client=client, **kwargs, **self._npt_options)

        return SerialTrainer(settings["hidden_sizes"], **kwargs)

    def _timeline(self, finetune_history: xr.Dataset, offset: float) -> xr.Dataset:
        recorder = HistoryRecorder("step")
        for coord, row in zip(self._pretrain._coords, self._pretrain._rows, strict=True):
            recorder.append(coord, **row)
        names = [n for n in finetune_history.data_vars if n != "phase"]
        for i, step in enumerate(finetune_history["step"].values):
            row = {"phase": "finetune", "phase_step": int(step)}
            for name in names:
                value = finetune_history[name].values[i].item()
                if isinstance(value, float) and math.isnan(value):
                    continue
                row[name] = value + offset if name == "time" else value
            recorder.append(self._pretrain_steps + int(step), **row)
        attrs = self._history_attrs(self._settings)
        ds = recorder.to_dataset(attrs)
        ds["phase"].attrs.update(long_name="training phase", flag_values=" ".join(PHASES))
        ds["phase_step"] = ds["phase_step"].astype(np.int64)
        ds["phase_step"].attrs.update(long_name="step within the phase", units="1")
        return ds

    def _run_attrs(self) -> dict:
        attrs = {f"time_{name}": float(value) for name, value in self.timings_.items() if not name.endswith("_each")}
        attrs["submodel_seeds"] = list(self.seeds_)
        attrs["submodel_sizes"] = [list(s) for s in self.partition_.submodels]
        counts = self.partition_.parameter_counts()
        attrs["parameters_full"] = counts["full"]
        attrs["parameters_submodel"] = counts["largest_submodel"]
        if self.diversity_ is not None:
            attrs["diversity_representation"] = self.diversity_["representation"]
            attrs["diversity_disagreement"] = self.diversity_["disagreement"]
        return attrs

    def partial_fit(self, X=None, y=None, classes=None, *, steps=None, epochs=None):
        """Fine-tune the full network one more epoch over ``X`` (or ``steps`` / ``epochs``).

        Parameters as :meth:`daskann.SerialTrainer.partial_fit`. The first call
        runs the whole method (sub-models, merge, fine-tuning) for one epoch (or
        ``steps`` / ``epochs``); later calls fine-tune the full network on ``X, y``
        or, when they are None, on the data of the last call.
        """
        return self._partial_fit(X, y, classes, steps, epochs)

    def _continue_fit(self, X, y, steps, epochs) -> None:
        trainer = self._finetuner
        if X is not None:
            # the fine-tuner trains on label positions: checked here, against this trainer's classes_
            X, y = self._encoded_for_finetuner(X, y)
        trainer.partial_fit(X, y, steps=steps, epochs=epochs)
        self._keep_finetuned(trainer)
        self.history_.attrs.update(self._run_attrs())

    def _keep_finetuned(self, trainer) -> None:
        """The fine-tuner's results as this trainer's, its history after the sub-models' and the merge's."""
        self._keep_results(
            trainer.model_, trainer.velocity_, trainer.n_steps_, self._timeline(trainer.history_, self._finetune_offset)
        )

    def _encoded_for_finetuner(self, X, y):
        """``X, y`` checked against this trainer's fit (features, ``classes_``), labels as their positions."""
        data = self._check_data(X, y, None, self._settings, model=self.model_, reset=False)
        return data.X, data.y


def _shared_settings(settings: dict) -> dict:
    """The settings sub-models and the fine-tuner share with this trainer, ``dtype`` by its name."""
    return {name: settings[name] for name in SHARED_SETTINGS} | {"dtype": settings["dtype"].name}


def _shared_copies(client, data, prefix: str):
    """One copy of the dask-array data on every worker: cut on one, replicated worker to worker."""
    arrays = [data.X, data.y, *(data.validation or ())]
    futures = [materialize(client, a, key=f"{prefix}-{i}") for i, a in enumerate(arrays)]
    client.replicate(futures)
    return futures[0], futures[1], (tuple(futures[2:]) if data.validation is not None else None)


def _fit_on_worker(trainer, X, y, validation, fit_kwargs: dict):
    """Fit ``trainer`` here and return it without its copy of the data (the client needs only the results)."""
    trainer.fit(X, y, validation_data=validation, **fit_kwargs)
    trainer.__dict__.pop("_data", None)
    return trainer


def _nan_reduce(values: np.ndarray, reduce):
    """``reduce`` over the finite entries along axis 0 (NaN where none), without warnings."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 1:
        finite = values[~np.isnan(values)]
        return float(reduce(finite)) if finite.size else float("nan")
    return np.array([_nan_reduce(column, reduce) for column in values.T])


def _advance_when_done(bar):
    """A ``watch`` for :func:`run_submodels`: a sub-model counts on ``bar`` once it finished or failed for good."""

    def watch(future):
        # a cancelled future (its data was lost) is replaced by a rerun, which is watched in turn
        future.add_done_callback(lambda f: bar.advance() if f.status in ("finished", "error") else None)

    return watch


def _npt_trainer_class(name: str):
    """:class:`daskann.NPTTrainer`, imported on first use (``name``: the parameter asking for it)."""
    try:
        from daskann.npt import NPTTrainer
    except ImportError as exc:
        raise invalid(name, "npt", f"'serial': the NPT trainer cannot be imported here ({exc})") from exc
    return NPTTrainer


__all__ = ["PHASES", "PartitionMergeOptions", "PartitionSplitOptions", "PartitionTrainer", "SubModelError"]
