"""NPTTrainer: network-parallel training of an MLP on a grid of Dask workers.

Beside the trainer, its ``engine`` options (:class:`NPTEngineOptions`) and what is checked before
its first training task: the options themselves; then, from the scheduler's view alone, the
cluster's workers, the grid and mode chosen for it (the cost model for ``"auto"``) and whether the
blocks fit a worker; last, on the grid's workers, every block of the checkpoint a run resumes from.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import get_args

import dask.array as da
import numpy as np
from distributed import Client

from daskann import store
from daskann._base import BaseTrainer, TrainingDiverged
from daskann._dask_input import is_dask_array
from daskann._history import HistoryRecorder
from daskann._options import OptionGroup, resolve_group
from daskann._validation import Activation, Loss, NPTMode, NPTPipeline, check_choice, check_float, invalid
from daskann.cluster import check_worker_memory, current_client, worker_addresses, worker_threads
from daskann.nn import MLP, SGD, activate
from daskann.npt import costmodel
from daskann.npt._run import FinalState, RunRecord, RunSpec, RunStart
from daskann.npt.costmodel import pipeline_chains
from daskann.npt.graph_mode import run_graph
from daskann.npt.grid import ProcessGrid, parse_grid

MODES = get_args(NPTMode)
PIPELINES = get_args(NPTPipeline)
#: accumulation chains per block product of each graph-mode pipeline
CHAINS = {"fused": 0, "single": 1, "double": 2}


class NPTEngineOptions(OptionGroup):
    """The ``engine`` options of :class:`NPTTrainer`: how the grid runs, beyond its shape and mode.

    Given as ``engine=NPTEngineOptions(...)`` or a dict of the same keywords
    (``engine={"deterministic": False}``); either way
    ``trainer.set_params(engine__deterministic=False)`` sets one option.

    Parameters
    ----------
    share_workers : bool
        Allow a grid with more cells than workers (cells dealt out
        round-robin); otherwise such a grid is an error.
    deterministic : bool
        Refuse clusters whose workers run more than one thread, whose results
        could depend on timing.
    pipeline : {"auto", "fused", "single", "double"}
        Graph mode only: how each output block's Cannon steps become tasks.
        ``"double"``: a task per block product in two accumulation chains
        (the next operands travel while the current product runs);
        ``"single"``: a task per block product in one chain; ``"fused"``: one
        task per output block running its products in Cannon order.
        ``"auto"`` picks by the size of a block product.
    timeout : float
        Seconds without progress after which training fails (never hangs).
    """

    group = "engine"

    def __init__(self, *, share_workers=False, deterministic=True, pipeline: NPTPipeline = "auto", timeout=120.0):
        self._store(locals())


def check_npt_options(grid, mode, engine, client) -> dict:
    """The trainer's ``grid``, ``mode``, ``engine`` and ``client`` checked: the options of an NPT run.

    Returns ``{"grid", "mode", "share_workers", "deterministic", "timeout", "pipeline"}``; raises
    before any task for a value that is not valid.
    """
    grid = parse_grid(grid)
    mode = check_choice("mode", mode, MODES)
    engine = resolve_group(engine, NPTEngineOptions)
    pipeline = check_choice(NPTEngineOptions.name_of("pipeline"), engine["pipeline"], PIPELINES)
    for name in ("share_workers", "deterministic"):
        if not isinstance(engine[name], (bool, np.bool_)):
            raise invalid(NPTEngineOptions.name_of(name), engine[name], "True or False", TypeError)
    timeout = check_float(NPTEngineOptions.name_of("timeout"), engine["timeout"], minimum=0.0, min_inclusive=False)
    if client is not None and not isinstance(client, Client):
        raise invalid("client", type(client).__name__, "a distributed.Client or None", TypeError)
    return {
        "grid": grid,
        "mode": mode,
        "share_workers": bool(engine["share_workers"]),
        "deterministic": bool(engine["deterministic"]),
        "timeout": timeout,
        "pipeline": pipeline,
    }


def check_cluster(client, npt: dict) -> list[str]:
    """The cluster's workers, checked against the options ``npt``: the scheduler's view only, no task submitted."""
    workers = worker_addresses(client)
    if not workers:
        raise invalid("client", "a cluster without workers", "a cluster with at least one worker")
    if npt["deterministic"]:
        threads = worker_threads(client)
        threaded = {w: threads[w] for w in workers if threads.get(w, 1) > 1}
        if threaded:
            w, n = next(iter(threaded.items()))
            raise invalid(
                NPTEngineOptions.name_of("deterministic"),
                True,
                f"a cluster whose workers run one thread each (worker {w} runs {n}; "
                f"{len(threaded)} of {len(workers)} workers are multi-threaded), "
                "or engine={'deterministic': False}",
            )
    if npt["grid"] != "auto":
        ProcessGrid.from_workers(npt["grid"], workers, share_workers=npt["share_workers"])
    return workers


def grid_and_mode(client, npt: dict, sizes, settings: dict):
    """``(grid, mode, plan, cost_model)`` for the checked options ``npt``.

    With a grid or mode ``"auto"`` the cluster is measured and the cost model picks them (``plan`` is
    its prediction table); otherwise ``plan`` and ``cost_model`` are None.
    """
    workers = worker_addresses(client)
    itemsize = np.dtype(settings["dtype"]).itemsize
    batch = settings["batch_size"]
    shape, mode, plan, model = npt["grid"], npt["mode"], None, None
    if shape == "auto" or mode == "auto":
        model = costmodel.measure(client)
        if shape == "auto":
            shape, mode, plan = costmodel.choose_grid(
                model, sizes, batch, mode=npt["mode"], n_workers=len(workers), itemsize=itemsize
            )
        else:
            if mode == "auto":
                mode = model.choose_mode(sizes, batch, shape, itemsize=itemsize)
            plan = model.plan(
                sizes, batch, n_workers=len(workers), mode=npt["mode"], grids=[tuple(shape)], itemsize=itemsize
            )
    grid = ProcessGrid.from_workers(shape, workers, share_workers=npt["share_workers"])
    return grid, mode, plan, model


def check_block_memory(client, grid: ProcessGrid, sizes, settings: dict) -> None:
    """Refuse a grid whose blocks cannot fit a worker, before any training task.

    A worker holds the weights and velocity of its cells plus, while a Cannon product runs, at most
    two blocks of each operand (the one in use and the next one travelling).
    """
    itemsize = np.dtype(settings["dtype"]).itemsize
    cells = max(grid.workers.count(w) for w in set(grid.workers))
    own = sum(-(-a // grid.rows) * -(-b // grid.cols) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    batch = -(-settings["batch_size"] // grid.rows)
    widest = max(-(-a // grid.rows) * -(-b // grid.cols) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    flight = 2 * (widest + batch * -(-max(sizes) // grid.cols))
    check_worker_memory(
        client,
        (2 * own + flight) * cells * itemsize,
        name="grid",
        what=f"{grid.rows}x{grid.cols} blocks (weights, velocity and Cannon operands in flight)",
    )


def verify_store(client, grid, path) -> None:
    """Check every block of the cell-written store ``path`` on the grid's workers, before any training task.

    One task per worker reads its share of the blocks, one at a time; a damaged block raises
    :class:`~daskann.exceptions.DamagedStoreError` naming the store, the array and the block.
    """
    workers = list(dict.fromkeys(grid.workers))
    blocks = store.stored_blocks(path)
    prefix = f"daskann-npt-{uuid.uuid4().hex[:12]}-verify"
    # spread over the grid's workers; any other may take over a share whose worker left
    futures = [
        client.submit(
            _verify_blocks,
            str(path),
            blocks[k :: len(workers)],
            key=f"{prefix}-{k}",
            workers=[w],
            allow_other_workers=True,
            pure=False,
        )
        for k, w in enumerate(workers)
    ]
    try:
        client.gather(futures)
    finally:
        client.cancel(futures)


def _verify_blocks(path: str, blocks) -> None:
    """Task body of :func:`verify_store`: check ``blocks`` (``(array, "i.j")``) of one store."""
    for name, index in blocks:
        store.verify_block(path, name, index)


class NPTTrainer(BaseTrainer):
    """Network-parallel training: every matrix product by Cannon's algorithm on a worker grid.

    Weights, biases, momentum and activations are cut into blocks that stay on
    the cells of a ``rows x cols`` grid of Dask workers for the whole run;
    forward propagation, the loss gradient, backward propagation and the SGD
    update all run there. The arithmetic is :class:`~daskann.SerialTrainer`'s
    (same batch order, loss scaling and update), block by block, so float64
    results agree with it to round-off on any grid.

    Parameters
    ----------
    hidden_sizes, activation, loss, lr, batch_size, epochs, steps, seed, verbose, network, sgd, checkpoint
        As :class:`daskann._base.BaseTrainer`.
    grid : "auto", "RxC" or (rows, cols)
        The process grid. ``"auto"`` measures the cluster and takes the grid
        with the fastest predicted step (``1x1``, a single worker, when no
        grid pays); see :mod:`daskann.npt.costmodel`.
    mode : {"auto", "graph", "resident"}
        ``"graph"``: one Dask task per block product (scales to big blocks,
        recovers from lost workers by replaying steps). ``"resident"``: one
        long-lived task per worker that exchanges blocks directly with its
        neighbours (no scheduler round trip per step; for small blocks). On
        a 1x1 grid its one cell steps as :class:`SerialTrainer` does, with
        serial's arithmetic and no messages. ``"auto"`` picks graph mode when a block product is long enough to
        hide the scheduler's per-task latency.
    engine : dict or NPTEngineOptions, optional
        The engine's rarer knobs: ``share_workers``, ``deterministic``,
        ``pipeline`` and ``timeout``; see :class:`NPTEngineOptions`.
        ``set_params(engine__timeout=600)`` sets one option.
    client : distributed.Client, optional
        Default: the current client, or an embedded LocalCluster closed after
        ``fit``.

    Attributes
    ----------
    model_ : MLP
        The trained network (numpy), read when first touched: both modes
        leave the final state on the grid and, with a ``checkpoint`` folder, in
        the last checkpoint its cells wrote (after divergence, the last
        finite state); ``predict``, ``predict_proba``
        and ``score`` run on the grid while the client does not hold it.
    weights_, biases_ : list of dask.array.Array
        The trained weights and biases chunked on the grid (resident mode:
        on its virtual Cannon grid), read from their cells while the cluster
        runs; otherwise numpy arrays of ``model_``.
    velocity_ : list of ndarray
        SGD velocity per parameter (``model_.params`` order).
    history_ : xarray.Dataset
        Over ``step``: ``loss``, ``time``, ``compute_time``, ``comm_time``,
        ``bytes_moved`` and, at evaluation steps, ``val_loss`` /
        ``val_accuracy``.
    n_steps_ : int
    batch_order_ : daskann.data.BatchOrder
    grid_ : ProcessGrid
        The grid used (after ``"auto"``; after a replay, the new workers).
    mode_ : str
        ``"graph"`` or ``"resident"``.
    plan_ : list of dict or None
        The cost model's prediction table when anything was ``"auto"``.
    recoveries_ : int
        Times training was replayed after losing a worker.
    worker_times_ : dict
        Of the last ``fit``: ``{completed step: {worker: {"wall", "compute",
        "serialise", "transfer", "idle"}}}``, where each worker's step time
        went (seconds; the four parts add up to ``wall``; resident mode adds
        ``recv_wait``). Graph mode reads it from the scheduler's task stream,
        resident mode from the workers' own timers.

    Examples
    --------
    >>> from daskann.data import make_linear
    >>> X, y = make_linear(256, 8, 2, seed=0)
    >>> trainer = NPTTrainer((16,), grid="2x2", mode="graph", client=client)  # doctest: +SKIP
    >>> trainer.fit(X, y, steps=10).grid_                                    # doctest: +SKIP
    """

    method = "npt"
    _reads_dask = True  # dask-array data is checked and read on the workers
    _option_groups = {**BaseTrainer._option_groups, "engine": NPTEngineOptions}

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
        grid="auto",
        mode: NPTMode = "auto",
        engine=None,
        client=None,
    ):
        self._store_params(locals())

    def _check_npt(self) -> dict:
        """The checked ``grid``, ``mode``, ``engine`` and ``client``: the options of an NPT run."""
        return check_npt_options(self.grid, self.mode, self.engine, self.client)

    # -- training ---------------------------------------------------------------------
    def fit(
        self,
        X,
        y,
        *,
        steps=None,
        epochs=None,
        validation_data=None,
        eval_every=None,
        init_model: MLP | None = None,
        resume=None,
    ):
        """Train on the grid from the initialisation (or ``init_model``, or a checkpoint).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like
            Targets for ``"mse"`` (any real numbers), class labels for
            ``"cross_entropy"`` (any hashable values, kept in ``classes_``).
        steps, epochs : int, optional
            Total training length for this call, at most one of the two; by
            default the trainer's ``steps`` or ``epochs``.
        validation_data : (X_val, y_val), optional
            Evaluated on the grid at evaluation steps.
        eval_every : int, optional
            Validation every this many steps (and at the end), as Keras's
            ``validation_freq``; by default once per epoch.
        init_model : MLP, optional
        resume : path, optional
            A checkpoint store or run folder, written by any trainer on any
            grid.

        Returns
        -------
        self
        """
        settings = self._check_settings(eval_every)
        npt = self._check_npt()
        data = self._check_data(X, y, validation_data, settings, model=init_model)
        order = self._batch_order(settings, data.n_samples)
        total = self._check_length(steps, epochs, order.steps_per_epoch)
        ckpt = self._resume_info(resume, settings, data, order) if resume is not None else None
        with self._client() as client, current_client(client), self._run_lock():
            workers = check_cluster(client, npt)
            # a column band of X per grid column stays on one worker
            bands = min(npt["grid"][1], len(workers)) if npt["grid"] != "auto" else len(workers)
            check_worker_memory(client, data.X.nbytes // max(bands, 1), name="X")
            self._keep_inputs(settings, data, order)
            self._npt = npt
            history = HistoryRecorder("step")
            start = self._run_start(ckpt, resume, init_model, history)
            self._sizes = (data.n_features, *settings["hidden_sizes"], data.n_outputs)
            self._check_checkpoint_space(settings, self._sizes, start.step, total)
            self.grid_, self.mode_, self.plan_, self.cost_model_ = grid_and_mode(client, npt, self._sizes, settings)
            self.recoveries_ = 0
            check_block_memory(client, self.grid_, self._sizes, settings)
            if start.path is not None and store.is_block_store(start.path):
                verify_store(client, self.grid_, start.path)
            self._run(client, start, total, history)
        return self

    def _run_start(self, ckpt, resume, init_model: MLP | None, history: HistoryRecorder) -> RunStart:
        """Where ``fit`` starts: the checkpoint ``ckpt`` (its history into ``history``), ``init_model`` or the seed.

        The client holds the starting state only when it was given one (``init_model``); a checkpoint
        is read, and the seeded initialisation computed, block by block on the grid's cells.
        """
        settings, data = self._settings, self._data
        if ckpt is not None:
            history.extend_from(store.run_history(resume, ckpt.step))
            return RunStart(ckpt.step, path=ckpt.path)
        if init_model is not None:
            model = self._initial_model(settings, data.n_features, data.n_outputs, init_model)
            return RunStart(0, model, SGD.init_state(model.params))
        return RunStart(0, seed=settings["seed"])

    def _resume_info(self, resume, settings, data, order):
        """The checkpoint to resume from, checked against this training; its arrays stay on disk."""
        info = store.checkpoint_info(resume)
        if not store.is_block_store(info.path):
            # written by one process, so small enough to verify here, before any task; the blocks of a
            # store written by the cells are verified on the workers, in one pass before training
            store.read_array_group(info.path, kind="checkpoint")
        self._check_resume(resume, info, settings, data, order)
        return info

    def partial_fit(self, X=None, y=None, classes=None, *, steps=None, epochs=None):
        """Continue training on the same grid: one more epoch over ``X`` (or ``steps`` / ``epochs``).

        Parameters as :meth:`daskann.SerialTrainer.partial_fit`: the first call fits
        (``classes`` fixing the labels), later ones continue on ``X, y`` or, when
        they are None, on the data of the last call.

        The cells continue from the last store they wrote or, in resident mode, from the state in their
        memory; the client loads no block. Without a ``checkpoint`` folder, a resident run that loses a grid
        worker during ``partial_fit`` loses that state and fails.
        """
        return self._partial_fit(X, y, classes, steps, epochs)

    def _continue_fit(self, X, y, steps, epochs) -> None:
        # checked against the net's sizes: the model stays where it is (on the grid, or in its store)
        self._continue_on(X, y, _sized(self._sizes))
        steps = self._partial_length(steps, epochs)
        history = self._continued_history()
        with self._client() as client, current_client(client), self._run_lock():
            alive = worker_addresses(client)
            previous = self._live_grid_state()
            if not set(self.grid_.workers) <= set(alive):
                self.grid_ = ProcessGrid.from_workers(self.grid_.shape, alive, share_workers=True)
                previous = None
            # continue from the last store the cells wrote, when the client does not hold the model, or
            # from the state the cells hold (graph mode: only without a store, whose blocks are read one
            # by one, so the cells never hold two states of a big net)
            source = self.__dict__.get("_final_store") if self.__dict__.get("_model") is None else None
            if self.mode_ == "graph" and source is not None:
                previous = None
            held = source is None and previous is None
            model, velocity = (self.model_, self.velocity_) if held else (None, None)
            start = RunStart(self.n_steps_, model, velocity, path=source, state=previous)
            self._run(client, start, self.n_steps_ + steps, history)

    def _fitted_output(self) -> str:
        return self._settings["output"]

    def _input_layout(self) -> tuple[int, np.dtype]:
        # from the settings: checking X must not load a model the client does not hold
        return self._sizes[0], np.dtype(self._settings["dtype"])

    def _run(self, client, begin: RunStart, stop: int, history: HistoryRecorder) -> None:
        """Train steps ``begin.step .. stop - 1`` from the state ``begin``, by the engine of ``mode_``."""
        if self.mode_ == "graph":
            engine = run_graph
        else:
            # on first use, so that a graph-mode run does not load the resident engine
            from daskann.npt.resident import run_resident as engine

        bar = self._progress_bar(stop, f"npt {self.grid_.rows}x{self.grid_.cols} {self.mode_}", initial=begin.step)
        offset = history.last_value("time", default=0.0)
        run = self._run_spec(begin.step, stop, offset, lambda done, loss: bar.update(done, loss=loss), history)
        record = RunRecord(self.grid_, history)
        self._grid_state = None
        # a resumed run that had no step left ends in the store it resumed from
        self._final_store = begin.path if begin.step == stop else None
        try:
            engine(client, run, begin, record)
        finally:
            bar.close()
            self._adopt(record)
            # a final state on the grid stays there: model_ is read from the last store, or gathered, when touched
            held = record.state is None
            self._keep_results(
                begin.model if held else None,
                begin.velocity if held else None,
                history.last_coord(default=begin.step),
                history.to_dataset(self._run_attrs(run)),
            )
        if self._final_store is None and self.client is None and self._live_grid_state() is not None:
            # the embedded cluster closes after fit: a final state held on the grid alone comes to the client now
            self.model_, self.velocity_ = self._grid_state.gather(self._settings)
        if record.diverged is not None:
            raise TrainingDiverged(*record.diverged)

    def _run_spec(self, start: int, stop: int, offset: float, progress, history: HistoryRecorder) -> RunSpec:
        """What the engine runs: steps ``start .. stop - 1`` of this fit, its evaluations and checkpoints.

        ``history`` is the run's record of its rows, which each checkpoint saves beside it.
        """
        settings, data, order = self._settings, self._data, self.batch_order_
        eval_every = settings["eval_every"] or order.steps_per_epoch
        ckpt_every = settings["checkpoint_every"]
        steps = range(start + 1, stop + 1)
        evaluated, checkpointed = data.validation is not None, self._checkpoint_dir is not None
        return RunSpec(
            X=data.X,
            y=data.y,
            validation=data.validation,
            order=order,
            settings=settings,
            sizes=tuple(self._sizes),
            stop=stop,
            run_id=f"daskann-npt-{uuid.uuid4().hex[:12]}",
            timeout=self._npt["timeout"],
            eval_steps=frozenset(d for d in steps if evaluated and (d % eval_every == 0 or d == stop)),
            checkpoint_steps=frozenset(
                d for d in steps if checkpointed and (d == stop or (ckpt_every and d % ckpt_every == 0))
            ),
            on_checkpoint=self._block_checkpoint_fn(stop, history),
            progress=progress,
            time_offset=offset,
            chains=self._chains() if self.mode_ == "graph" else 0,
        )

    def _adopt(self, record: RunRecord) -> None:
        """The grid, the replays, the workers' step times and the state on the cells of a run, as far as it came."""
        self.grid_ = record.grid
        self.recoveries_ += record.recoveries
        self.worker_times_ = record.worker_times
        if record.state is not None:
            self._grid_state = record.state

    def _run_attrs(self, run: RunSpec) -> dict:
        """The history's attributes: the settings, and the grid, mode and replays of the run."""
        attrs = self._history_attrs(self._settings)
        attrs.update(
            {
                "grid": f"{self.grid_.rows}x{self.grid_.cols}",
                "mode": self.mode_,
                "workers": len(set(self.grid_.workers)),
                "recoveries": int(self.recoveries_),
            }
        )
        if self.mode_ == "graph":
            attrs["pipeline"] = next(name for name, chains in CHAINS.items() if chains == run.chains)
        return attrs

    def _block_checkpoint_fn(self, stop: int, history: HistoryRecorder):
        """``save(step, layout, write, rows) -> path``: a store whose blocks the cells write, committed here.

        ``write(tmp)`` writes every block from its cell; the store of step ``stop`` becomes the final one.
        The history through ``step`` (``history``'s rows, then ``rows``) is saved beside it first, as
        serial training saves it, so that a run resumed after its job ended keeps every row.

        One format for both modes (graph mode cuts it on the grid, resident mode on its virtual Cannon
        grid): either resumes the other's checkpoints, on any grid.
        """
        settings, directory, order = self._settings, self._checkpoint_dir, self.batch_order_
        net = {
            "sizes": list(self._sizes),
            "activation": settings["activation"],
            "output": settings["output"],
            "dtype": np.dtype(settings["dtype"]).name,
            "negative_slope": settings["negative_slope"],
        }
        training = self._training_config(settings)
        extra = {"grid": f"{self.grid_.rows}x{self.grid_.cols}", "mode": self.mode_}

        def save(step, layout, write, rows):
            saved = history.with_rows({d: values for d, values in rows.items() if d <= step})
            store.save_history(saved.to_dataset(self._history_attrs(settings)), Path(directory) / store.HISTORY_STORE)
            attrs = store.checkpoint_attrs(net, step, order.get_state(), training, extra)
            path = store.write_block_group(store.checkpoint_path(directory, step), layout, write, attrs)
            if step == stop:
                self._final_store = path
            return path

        return save

    def _chains(self) -> int:
        """Graph mode's accumulation chains per block product: the ``pipeline`` asked for, else the cost model's."""
        if self._npt["pipeline"] != "auto":
            return CHAINS[self._npt["pipeline"]]
        return pipeline_chains(self._sizes, self._settings["batch_size"], self.grid_.shape)

    # -- results, read where they live ----------------------------------------------
    # After a run the final state stays on the grid's cells (_grid_state) and, with a checkpoint folder, in
    # the last store they wrote (_final_store): model_ and velocity_ are read when first touched, weights_ and
    # biases_ are dask arrays over the cells' blocks, and predictions run on the grid while the client does
    # not hold the model.
    @property
    def model_(self) -> MLP:
        """The trained network (numpy arrays), read when first touched.

        From the final checkpoint the grid's cells wrote, else gathered from the grid; until then
        the client holds no block.
        """
        if self.__dict__.get("_model") is None:
            self._load_final()
        return self._model

    @model_.setter
    def model_(self, value) -> None:
        self._model = value

    @property
    def velocity_(self) -> list:
        """SGD velocity per parameter (``model_.params`` order), read with :attr:`model_`."""
        if self.__dict__.get("_model") is None:
            self._load_final()
        return self._velocity

    @velocity_.setter
    def velocity_(self, value) -> None:
        self._velocity = value

    def _load_final(self) -> None:
        self._model, self._velocity = self._read_final()

    def _read_final(self) -> tuple:
        """Model and velocity from the last store the cells wrote, else gathered from the grid."""
        path = self.__dict__.get("_final_store")
        if path is not None:
            ckpt = store.load_checkpoint(path)
            return ckpt.model, ckpt.velocity
        state = self._live_grid_state()
        if state is None:
            raise AttributeError(f"{type(self).__name__} has no model_ (not fitted, or its grid is gone)")
        return state.gather(self._settings)

    def __sklearn_is_fitted__(self) -> bool:
        return any(self.__dict__.get(name) is not None for name in ("_model", "_final_store")) or (
            self._live_grid_state() is not None
        )

    def _grid_client(self):
        """The client of the final grid state while its cluster runs, else None."""
        state = self._live_grid_state()
        if state is None or self.__dict__.get("_model") is not None:
            return None
        return state.client

    def _compute(self, array) -> np.ndarray:
        client = self._grid_client()
        return client.compute(array, sync=True) if client is not None else super()._compute(array)

    def _logits(self, X):
        """Computed on the grid, from :attr:`weights_`, while the client does not hold the model.

        Each layer is ``A @ W + b`` on dask arrays chunked as the grid's blocks; numpy ``X`` is
        scattered once (not held in the graph), dask-array ``X`` is read where it is and the result
        stays lazy.
        """
        client = self._grid_client()
        if client is None:
            return super()._logits(X)
        lazy = is_dask_array(X)
        if not lazy:
            # a key of its own: a re-scattered twin of a key being released would lose its data
            X = da.from_delayed(client.scatter(X, hash=False), X.shape, dtype=X.dtype)
        settings, weights, biases = self._settings, self.weights_, self.biases_
        A = X.rechunk({1: weights[0].chunks[0]})
        for W, b in zip(weights, biases, strict=True):
            Z = A @ W + b
            A = Z.map_blocks(activate, settings["activation"], settings["negative_slope"], dtype=Z.dtype)
        Z = Z.rechunk({1: -1})
        return Z if lazy else client.compute(Z, sync=True)

    @property
    def weights_(self) -> list:
        """Trained weight matrices as dask arrays whose chunks are the grid's blocks, where they live.

        Built from the final state's block futures (in resident mode, chunked on the virtual Cannon
        grid's blocks): nothing moves until computed (on the trainer's client, e.g.
        ``client.compute(w)``). Once the embedded cluster of ``client=None`` is closed, numpy arrays
        of :attr:`model_`.
        """
        state = self._live_grid_state()
        if state is None:
            return super().weights_
        return state.weights()

    @property
    def biases_(self) -> list:
        """Trained bias vectors, as :attr:`weights_` (one chunk per grid column, on its column's first cell)."""
        state = self._live_grid_state()
        if state is None:
            return super().biases_
        return state.biases()

    def __getstate__(self):
        # the final state's futures belong to one live client, and a copy may load where neither the grid nor
        # the checkpoint folder is: the copy holds the model itself; the live trainer keeps reading where it is
        state = super().__getstate__()
        state.pop("_grid_state", None)
        if state.get("_model") is None and (
            state.get("_final_store") is not None or self._live_grid_state() is not None
        ):
            state["_model"], state["_velocity"] = self._read_final()
        return state

    def _live_grid_state(self) -> FinalState | None:
        """The final state on the grid while its cluster runs (an embedded cluster is closed after ``fit``)."""
        state = getattr(self, "_grid_state", None)
        if state is None or not state.futures:
            return None
        return state if state.client.status == "running" else None


def _sized(sizes) -> MLP:
    """An MLP that carries only ``sizes``, all the data checks read: no weight is made or loaded."""
    net = MLP.__new__(MLP)
    net.sizes = tuple(sizes)
    return net
