"""NPTTrainer: network-parallel training of an MLP on a grid of Dask workers."""

from __future__ import annotations

import operator
import time
import uuid
from dataclasses import dataclass, replace

import numpy as np

from daskann import config
from daskann._base import BaseTrainer, TrainingDiverged
from daskann._dask_input import is_dask_array
from daskann._history import HistoryRecorder
from daskann._options import OptionGroup, resolve_group
from daskann._typing import Activation, Loss, NPTMode, NPTPipeline
from daskann._validation import check_choice, check_float, invalid
from daskann.nn import MLP, SGD
from daskann.npt.grid import ProcessGrid, parse_grid

MODES = ("auto", "graph", "resident")

PIPELINES = ("auto", "fused", "single", "double")
_CHAINS = {"fused": 0, "single": 1, "double": 2}


def resident_available() -> bool:
    """Whether the resident-mode engine can be imported."""
    try:
        from daskann.npt import resident  # noqa: F401
    except ImportError:
        return False
    return True


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
        leave the final state on the grid and, with ``checkpoint_dir``, in
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

    # -- checks ---------------------------------------------------------------------
    def _check_npt(self) -> dict:
        from distributed import Client

        grid = parse_grid(self.grid)
        mode = check_choice("mode", self.mode, MODES)
        engine = resolve_group(self.engine, NPTEngineOptions)
        pipeline = check_choice("engine['pipeline']", engine["pipeline"], PIPELINES)
        for name in ("share_workers", "deterministic"):
            if not isinstance(engine[name], (bool, np.bool_)):
                raise invalid(f"engine[{name!r}]", engine[name], "True or False", TypeError)
        timeout = check_float("engine['timeout']", engine["timeout"], minimum=0.0, min_inclusive=False)
        if self.client is not None and not isinstance(self.client, Client):
            raise invalid("client", type(self.client).__name__, "a distributed.Client or None", TypeError)
        if mode == "resident" and not resident_available():
            raise invalid("mode", mode, "'graph' or 'auto' (the resident engine cannot be imported here)")
        return {
            "grid": grid,
            "mode": mode,
            "share_workers": bool(engine["share_workers"]),
            "deterministic": bool(engine["deterministic"]),
            "timeout": timeout,
            "pipeline": pipeline,
        }

    def _check_cluster(self, client, npt: dict) -> list[str]:
        """Worker checks that need the scheduler's view but submit nothing."""
        from daskann.cluster import worker_addresses, worker_threads

        workers = worker_addresses(client)
        if not workers:
            raise invalid("client", "a cluster without workers", "a cluster with at least one worker")
        if npt["deterministic"]:
            threads = worker_threads(client)
            threaded = {w: threads[w] for w in workers if threads.get(w, 1) > 1}
            if threaded:
                w, n = next(iter(threaded.items()))
                raise invalid(
                    "engine['deterministic']",
                    True,
                    f"a cluster whose workers run one thread each (worker {w} runs {n}; "
                    f"{len(threaded)} of {len(workers)} workers are multi-threaded), "
                    "or engine={'deterministic': False}",
                )
        if npt["grid"] != "auto":
            ProcessGrid.from_workers(npt["grid"], workers, share_workers=npt["share_workers"])
        return workers

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
        from daskann import store
        from daskann.cluster import current_client, resolve_client

        with resolve_client(self.client) as client, current_client(client), self._run_lock():
            workers = self._check_cluster(client, npt)
            # a column band of X per grid column stays on one worker
            from daskann.cluster import check_worker_memory

            bands = min(npt["grid"][1], len(workers)) if npt["grid"] != "auto" else len(workers)
            check_worker_memory(client, data.X.nbytes // max(bands, 1), name="X")
            self._settings, self._data, self.batch_order_, self._npt = settings, data, order, npt
            history = HistoryRecorder("step")
            # the client holds the starting state only when it was given one (init_model); a checkpoint
            # is read, and the seeded initialisation computed, block by block on the grid's cells
            model = velocity = born = None
            if ckpt is not None:
                done = ckpt.step
                history.extend_from(_previous_history(resume, done))
            elif init_model is not None:
                model = self._initial_model(settings, data.n_features, data.n_outputs, init_model)
                velocity, done = SGD.init_state(model.params), 0
            else:
                done, born = 0, settings["seed"]
            self._sizes = (data.n_features, *settings["hidden_sizes"], data.n_outputs)
            self._check_checkpoint_space(settings, self._sizes, done, total)
            self._setup_grid(client, npt, self._sizes, settings)
            self._check_block_memory(client, settings)
            source = None if ckpt is None else ckpt.path
            if source is not None and store.is_block_store(source):
                self._verify_store(client, source)
            self._run(client, model, velocity, done, total, history, born=born, source=source)
        return self

    def _resume_info(self, resume, settings, data, order):
        """The checkpoint to resume from, checked against this training; its arrays stay on disk."""
        from daskann import store

        info = store.checkpoint_info(resume)
        if not store.is_block_store(info.path):
            # written by one process, so small enough to verify here, before any task; the blocks of a
            # store written by the cells are verified on the workers, in one pass before training
            store.read_array_group(info.path, kind="checkpoint")
        self._check_resume(resume, info, settings, data, order)
        return info

    def _verify_store(self, client, path) -> None:
        """Check every block of the cell-written store ``path`` on the grid's workers, before any training task.

        One task per worker reads its share of the blocks, one at a time; a damaged block raises
        :class:`~daskann.exceptions.DamagedStoreError` naming the store, the array and the block.
        """
        from daskann import store

        workers = list(dict.fromkeys(self.grid_.workers))
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

    def _check_block_memory(self, client, settings) -> None:
        """Refuse a grid whose blocks cannot fit a worker, before any training task.

        A worker holds the weights and velocity of its cells plus, while a Cannon product runs, at most
        two blocks of each operand (the one in use and the next one travelling).
        """
        from daskann.cluster import check_worker_memory

        grid, sizes, itemsize = self.grid_, self._sizes, np.dtype(settings["dtype"]).itemsize
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

    def partial_fit(self, X=None, y=None, classes=None, *, steps=None, epochs=None):
        """Continue training on the same grid: one more epoch over ``X`` (or ``steps`` / ``epochs``).

        Parameters as :meth:`daskann.SerialTrainer.partial_fit`: the first call fits
        (``classes`` fixing the labels), later ones continue on ``X, y`` or, when
        they are None, on the data of the last call.

        The cells continue from the last store they wrote or, in resident mode, from the state in their
        memory; the client loads no block. Without ``checkpoint_dir``, a resident run that loses a grid
        worker during ``partial_fit`` loses that state and fails.
        """
        if not self.__sklearn_is_fitted__():
            return self._first_partial_fit(X, y, classes, steps, epochs)
        from daskann.cluster import current_client, resolve_client

        self._check_partial_classes(classes)
        settings = self._settings
        if X is not None:
            # checked against the net's sizes: the model stays where it is (on the grid, or in its store)
            validation = self._data.validation
            self._data = self._check_data(X, y, None, settings, model=_sized(self._sizes), reset=False)
            self._data.validation = validation
            self.batch_order_ = self._batch_order(settings, self._data.n_samples)
        steps = self._partial_length(steps, epochs)
        history = HistoryRecorder("step")
        history.extend_from(self.history_)
        with resolve_client(self.client) as client, current_client(client), self._run_lock():
            from daskann.cluster import worker_addresses

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
            self._run(
                client,
                model,
                velocity,
                self.n_steps_,
                self.n_steps_ + steps,
                history,
                source=source,
                previous=previous,
            )
        return self

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
        from daskann import store

        path = self.__dict__.get("_final_store")
        if path is not None:
            ckpt = store.load_checkpoint(path)
            self._model, self._velocity = ckpt.model, ckpt.velocity
            return
        state = self._live_grid_state()
        if state is None:
            raise AttributeError(f"{type(self).__name__} has no model_ (not fitted, or its grid is gone)")
        self._model, self._velocity = self._gather_grid(state)

    def _gather_grid(self, state):
        """Model and velocity of a grid state, gathered to the client."""
        from types import SimpleNamespace

        from daskann.npt.graph_mode import GraphEngine

        if _is_resident(state):
            return state.gather(self._settings)
        client = next(iter(state.futures.values())).client
        engine = GraphEngine(client, self.grid_, sizes=self._sizes, settings=self._settings, prefix="gather")
        like = SimpleNamespace(**{k: self._settings[k] for k in ("activation", "output", "negative_slope")})
        return engine.gather_state(state, like)

    def __sklearn_is_fitted__(self) -> bool:
        return any(self.__dict__.get(name) is not None for name in ("_model", "_final_store")) or (
            self._live_grid_state() is not None
        )

    def _fitted_output(self) -> str:
        return self._settings["output"]

    def _input_layout(self) -> tuple[int, np.dtype]:
        # from the settings: checking X must not load a model the client does not hold
        return self._sizes[0], np.dtype(self._settings["dtype"])

    def _grid_client(self):
        """The client of the final grid state while its cluster runs, else None."""
        state = self._live_grid_state()
        if state is None or self.__dict__.get("_model") is not None:
            return None
        return next(iter(state.futures.values())).client

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
        import dask.array as da

        from daskann.nn import activate

        s, weights, biases = self._settings, self.weights_, self.biases_
        lazy = is_dask_array(X)
        if not lazy:
            # a key of its own: a re-scattered twin of a key being released would lose its data
            X = da.from_delayed(client.scatter(X, hash=False), X.shape, dtype=X.dtype)
        A = X.rechunk({1: weights[0].chunks[0]})
        for W, b in zip(weights, biases, strict=True):
            Z = A @ W + b
            A = Z.map_blocks(activate, s["activation"], s["negative_slope"], dtype=Z.dtype)
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
        if _is_resident(state):
            return state.weights()
        return [mat.to_dask() for mat in state.weights]

    @property
    def biases_(self) -> list:
        """Trained bias vectors, as :attr:`weights_` (one chunk per grid column, on its column's first cell)."""
        state = self._live_grid_state()
        if state is None:
            return super().biases_
        if _is_resident(state):
            return state.biases()
        return [_bias_to_dask(line, state.futures, np.dtype(self._settings["dtype"])) for line in state.biases]

    def __getstate__(self):
        # the final state's futures belong to one live client: a pickled trainer keeps model_ alone
        if self.__dict__.get("_model") is None and self.__dict__.get("_final_store") is None:
            if self._live_grid_state() is not None:
                self._load_final()
        state = super().__getstate__()
        state.pop("_grid_state", None)
        return state

    def _live_grid_state(self):
        """The final graph-mode state while its cluster runs (an embedded cluster is closed after ``fit``)."""
        state = getattr(self, "_grid_state", None)
        if state is None or not state.futures:
            return None
        return state if next(iter(state.futures.values())).client.status == "running" else None

    def _setup_grid(self, client, npt: dict, sizes, settings) -> None:
        from daskann.cluster import worker_addresses
        from daskann.npt import costmodel

        workers = worker_addresses(client)
        itemsize = np.dtype(settings["dtype"]).itemsize
        batch = settings["batch_size"]
        available = resident_available()
        self.plan_ = None
        self.cost_model_ = None
        if npt["grid"] == "auto" or npt["mode"] == "auto":
            model = costmodel.measure(client)
            self.cost_model_ = model
            if npt["grid"] == "auto":
                shape, mode, table = costmodel.choose_grid(
                    model,
                    sizes,
                    batch,
                    mode=npt["mode"],
                    n_workers=len(workers),
                    resident_available=available,
                    itemsize=itemsize,
                )
                self.plan_ = table
            else:
                shape = npt["grid"]
                mode = (
                    npt["mode"]
                    if npt["mode"] != "auto"
                    else model.choose_mode(sizes, batch, shape, resident_available=available, itemsize=itemsize)
                )
                self.plan_ = model.plan(
                    sizes,
                    batch,
                    n_workers=len(workers),
                    mode=npt["mode"],
                    resident_available=available,
                    itemsize=itemsize,
                    grids=[tuple(shape)],
                )
        else:
            shape, mode = npt["grid"], npt["mode"]
        self.grid_ = ProcessGrid.from_workers(shape, workers, share_workers=npt["share_workers"])
        self.mode_ = mode
        self.recoveries_ = 0

    def _run(
        self,
        client,
        model: MLP | None,
        velocity,
        start: int,
        stop: int,
        history: HistoryRecorder,
        *,
        born: int | None = None,
        source=None,
        previous=None,
    ) -> None:
        """Train from ``model`` and ``velocity``, or (both None) the store ``source``, the seed ``born`` or
        the state ``previous`` the cells hold."""
        settings, data, order = self._settings, self._data, self.batch_order_
        eval_every = settings["eval_every"] or order.steps_per_epoch
        ckpt_every = settings["checkpoint_every"]
        eval_steps = (
            frozenset(d for d in range(start + 1, stop + 1) if d % eval_every == 0 or d == stop)
            if data.validation is not None
            else frozenset()
        )
        ckpt_steps = (
            frozenset(d for d in range(start + 1, stop + 1) if d == stop or (ckpt_every and d % ckpt_every == 0))
            if self._checkpoint_dir is not None
            else frozenset()
        )
        bar = self._progress_bar(stop, f"npt {self.grid_.rows}x{self.grid_.cols} {self.mode_}", initial=start)
        stretch = _Stretch(
            start,
            stop,
            f"daskann-npt-{uuid.uuid4().hex[:12]}",
            eval_steps,
            ckpt_steps,
            offset=history.last_value("time", default=0.0),
            seed=born,
        )
        self._grid_state = self._final_store = None
        self.model_, self.velocity_, self.worker_times_ = model, velocity, {}
        diverged = None
        try:
            if self.mode_ == "graph":
                diverged = self._run_graph(
                    client, model, velocity, stretch, history, bar, source=source, previous=previous
                )
            else:
                start_from = _Start(model, velocity, source=source, previous=previous)
                diverged = self._run_resident(client, start_from, stretch, history, bar)
        finally:
            bar.close()
            self.n_steps_ = history.last_coord(default=start)
            attrs = self._history_attrs(settings)
            attrs.update(
                {
                    "grid": f"{self.grid_.rows}x{self.grid_.cols}",
                    "mode": self.mode_,
                    "workers": len(set(self.grid_.workers)),
                    "recoveries": int(self.recoveries_),
                }
            )
            if self.mode_ == "graph":
                attrs["pipeline"] = {0: "fused", 1: "single", 2: "double"}[self._chains(self._sizes)]
            self.history_ = history.to_dataset(attrs)
        if diverged is not None:
            raise TrainingDiverged(*diverged)

    def _block_checkpoint_fn(self, stop: int):
        """``save(step, layout, write) -> path``: a store whose blocks the cells write, committed here.

        One format for both modes (graph mode cuts it on the grid, resident mode on its virtual Cannon
        grid): either resumes the other's checkpoints, on any grid.
        """
        from daskann import store

        settings, order = self._settings, self.batch_order_
        config = {
            "sizes": list(self._sizes),
            "activation": settings["activation"],
            "output": settings["output"],
            "dtype": np.dtype(settings["dtype"]).name,
            "negative_slope": settings["negative_slope"],
        }

        def save(step, layout, write):
            extra = {"grid": f"{self.grid_.rows}x{self.grid_.cols}", "mode": self.mode_}
            attrs = store.checkpoint_attrs(config, step, order.get_state(), self._training_config(settings), extra)
            path = store.write_block_group(store.checkpoint_path(self._checkpoint_dir, step), layout, write, attrs)
            if step == stop:
                self._final_store = path
            return path

        return save

    def _run_graph(self, client, model, velocity, stretch: _Stretch, history, bar, *, source=None, previous=None):
        from daskann.npt._graph_run import GraphRun, train_graph

        data = self._data
        run = GraphRun(
            X=data.X,
            y=data.y,
            validation=data.validation,
            order=self.batch_order_,
            settings=self._settings,
            stop=stretch.stop,
            run_id=stretch.run_id,
            chains=self._chains(self._sizes),
            timeout=self._npt["timeout"],
            eval_steps=stretch.eval_steps,
            checkpoint_steps=stretch.ckpt_steps,
            on_checkpoint=self._block_checkpoint_fn(stretch.stop),
            progress=lambda done, loss: bar.update(done, loss=loss),
            time_offset=stretch.offset,
            seed=stretch.seed,
            sizes=tuple(self._sizes),
        )
        result = train_graph(
            client, self.grid_, run, model=model, velocity=velocity, start=stretch.start, path=source, state=previous
        )
        for done in sorted(result.rows):
            history.append(done, **result.rows[done])
        self.worker_times_.update(result.timings)
        # the final state stays on the grid: model_ is read from the last store, or gathered, when touched
        self.model_, self.velocity_ = result.model, result.velocity
        self._grid_state = result.state
        self.grid_ = result.grid
        if result.model is None and self._final_store is None and self.client is None:
            # the cluster of client=None may close after fit: gather while it runs
            self.model_, self.velocity_ = self._gather_grid(result.state)
        self.recoveries_ += result.recoveries
        if result.diverged_step is not None:
            return result.diverged_step, result.diverged_what
        return None

    def _chains(self, sizes) -> int:
        from daskann.npt.costmodel import pipeline_chains

        if self._npt["pipeline"] != "auto":
            return _CHAINS[self._npt["pipeline"]]
        return pipeline_chains(sizes, self._settings["batch_size"], self.grid_.shape)

    def _run_resident(self, client, start_from: _Start, stretch: _Stretch, history, bar):
        """Resident stretches between checkpoints; the state stays on the cells, which also write the stores."""
        t0 = time.perf_counter() - stretch.offset
        save = self._block_checkpoint_fn(stretch.stop)
        current, attempts = stretch.start, 0
        for seg_stop in sorted(stretch.ckpt_steps | {stretch.stop}):
            if seg_stop <= current:
                continue
            writes = save if seg_stop in stretch.ckpt_steps else None
            result, path, seg_t0, attempts = self._resident_segment(
                client, start_from, current, seg_stop, stretch, attempts, save=writes
            )
            self._record_resident(result, current, seg_t0 - t0, time.perf_counter() - seg_t0, history, bar)
            self._grid_state, self.model_, self.velocity_ = result.state, None, None
            if result.diverged_step is not None:
                # the cells rolled back to the last finite state: model_ reads it when touched
                self._keep_if_closing()
                return result.diverged_step, "the loss, its gradients or the weights"
            current = seg_stop
            # the next stretch continues from the cells' memory, or after a lost worker, from the store
            start_from = _Start(source=path, previous=result.state)
        self._keep_if_closing()
        return None

    def _keep_if_closing(self) -> None:
        """Gather a final state held on the grid alone while its cluster runs, if that cluster closes after fit."""
        if self._final_store is None and self.client is None and self._live_grid_state() is not None:
            self.model_, self.velocity_ = self._gather_grid(self._grid_state)

    def _resident_segment(
        self, client, start_from: _Start, start: int, stop: int, stretch: _Stretch, attempts: int, *, save=None
    ):
        """Steps ``start .. stop - 1`` in resident mode, restarted on the workers there are if a grid worker left.

        With ``save`` (see :meth:`_block_checkpoint_fn`), the cells then write the checkpoint of step ``stop``.
        Returns the result, the checkpoint's path (or None), when the (successful) try began, and the tries
        of the stretch so far.
        """
        from daskann.cluster import worker_addresses
        from daskann.npt._graph_run import _regrid
        from daskann.npt.resident import ResidentError, train_resident

        data = self._data
        restarts = 0  # the budget is per checkpoint interval, as graph mode's replays
        while True:
            seg_t0 = time.perf_counter()
            try:
                result = train_resident(
                    client,
                    self.grid_,
                    model=start_from.model,
                    velocity=start_from.velocity,
                    sizes=self._sizes,
                    source=start_from.source if start_from.previous is None else None,
                    previous=start_from.previous,
                    keep=True,
                    X=data.X,
                    y=data.y,
                    order=self.batch_order_,
                    settings=self._settings,
                    start=start,
                    stop=stop,
                    run_id=f"{stretch.run_id}-r{attempts}",
                    timeout=self._npt["timeout"],
                    eval_fn=(lambda d: d in stretch.eval_steps) if stretch.eval_steps else None,
                    validation=data.validation,
                    seed=stretch.seed if start == 0 and start_from.model is None else None,
                )
                path = None
                if save is not None and result.diverged_step is None:
                    state = result.state
                    path = save(stop, state.layout.store_layout(state.dtype), state.save)
                return result, path, seg_t0, attempts
            except ResidentError as exc:
                alive = set(worker_addresses(client))
                if set(self.grid_.workers) <= alive:
                    raise
                if restarts >= (max_restarts := config.count("npt.resident-restarts")):
                    raise ResidentError(
                        f"resident training lost grid workers {restarts + 1} times since step {start}; "
                        f"giving up after {max_restarts} restarts from that state ({exc})"
                    ) from exc
                # a worker left: restart this stretch from its starting state on the workers there are
                attempts += 1
                restarts += 1
                self.recoveries_ += 1
                self.grid_ = _regrid(client, self.grid_, self._npt["timeout"])
                start_from = start_from.after_regrid(exc)

    def _record_resident(self, result, start: int, clock: float, elapsed: float, history, bar) -> None:
        """History rows of a resident segment that began ``clock`` seconds into the run and took ``elapsed``.

        The segment's wall time is shared out over its steps in proportion to each step's compute and comm time.
        """
        busy = sum(r["compute_time"] + r["comm_time"] for r in result.rows) or 1.0
        for k, row in enumerate(result.rows):
            done = start + k + 1
            clock += (row["compute_time"] + row["comm_time"]) * elapsed / busy
            values = {
                "loss": row["loss"],
                "time": clock,
                "compute_time": row["compute_time"],
                "comm_time": row["comm_time"],
                "bytes_moved": float(row["bytes_moved"]),
            }
            # evaluated by the cells: neither the model nor the validation data came to the client
            values.update(result.evaluations.get(done, {}))
            self.worker_times_[done] = row["workers"]
            history.append(done, **values)
            bar.update(done, loss=row["loss"])


@dataclass(frozen=True)
class _Start:
    """The state a resident stretch starts from, in order of preference.

    ``previous``: the state the cells hold (a :class:`daskann.npt.resident.ResidentState`); ``source``:
    a checkpoint store they read; ``model`` and ``velocity``: held by the client. With none, the
    seeded initialisation, computed on the cells.
    """

    model: MLP | None = None
    velocity: list | None = None
    source: object = None
    previous: object = None

    def after_regrid(self, cause: Exception) -> _Start:
        """Where a restart on a new grid begins: the cells' memory is gone with the worker that left."""
        if self.previous is None:
            return self
        if self.source is None:
            from daskann.npt.resident import ResidentError

            raise ResidentError(
                f"resident training lost a grid worker and, with it, state no checkpoint holds ({cause})"
            ) from cause
        return replace(self, previous=None)


@dataclass(frozen=True)
class _Stretch:
    """Steps ``start .. stop - 1`` of one ``fit`` or ``partial_fit`` call and what happens along the way."""

    start: int
    stop: int
    run_id: str  # prefix of every task key of the stretch
    eval_steps: frozenset  # step counts after which the validation set is evaluated
    ckpt_steps: frozenset  # step counts after which a checkpoint is saved
    offset: float = 0.0  # seconds already on the history's clock
    seed: int | None = None  # the state at step 0 is this seed's initialisation, computed on the cells


def _is_resident(state) -> bool:
    """Whether a live final state is a resident run's (:class:`daskann.npt.resident.ResidentState`)."""
    return hasattr(state, "layout")


def _sized(sizes) -> MLP:
    """An MLP that carries only ``sizes``, all the data checks read: no weight is made or loaded."""
    net = MLP.__new__(MLP)
    net.sizes = tuple(sizes)
    return net


def _verify_blocks(path: str, blocks) -> None:
    """Task body of :meth:`NPTTrainer._verify_store`: check ``blocks`` (``(array, "i.j")``) of one store."""
    from daskann.store import verify_block

    for name, index in blocks:
        verify_block(path, name, index)


def _bias_to_dask(blocks, futures: dict, dtype):
    """A 1-d dask array over a layer's bias blocks (``{"b", "v"}`` dicts on the grid), read where they live."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    from daskann._compat import Task, TaskRef

    name = f"{blocks[0].key}-dask-{uuid.uuid4().hex[:6]}"
    dsk = {}
    for j, blk in enumerate(blocks):
        dsk[(f"{name}-source", j)] = futures[blk.key]  # keeps the block alive
        dsk[(name, j)] = Task((name, j), operator.getitem, TaskRef((f"{name}-source", j)), blk.field)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    chunks = (tuple(blk.shape[1] for blk in blocks),)
    return da.Array(graph, name, chunks, dtype=dtype, shape=(sum(chunks[0]),))


def _previous_history(resume, upto: int):
    """History saved in a resumed run folder, up to the checkpoint's step (None if there is none)."""
    from pathlib import Path

    from daskann import store

    path = Path(resume) / "history.zarr"
    if not path.exists():
        return None
    history = store.load_history(path)
    return history.sel(step=history["step"] <= upto)
