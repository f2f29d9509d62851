"""Graph mode of network-parallel training: one task per block product, and its training loop.

Weights, biases, velocities and activations live on the cells of the grid
as futures; each training step is one graph of pinned tasks sent to the
scheduler in one message:

* the minibatch's blocks are cut from column bands of the data (one band
  per grid column, scattered once);
* forward: ``Z_l = act(Z_{l-1}) @ W_l + b_l`` by Cannon products, the bias
  added in the last task of each block; activations are applied by the
  tasks that read them, so only ``Z`` is stored;
* loss gradient: per block for MSE on a linear output; per grid row (a row
  panel, because the softmax needs whole output rows) otherwise;
* backward: ``dZ_{l-1} = (dZ_l @ W_l.T) * act'(Z_{l-1})`` and
  ``dW_l = act(Z_{l-1}).T @ dZ_l`` by Cannon products, the velocity update
  fused into the last task of each ``dW`` block, then ``W -= lr * v`` on the
  owner; bias gradients (column sums of ``dZ``) and updates on the first
  cell of each grid column, which also adds up the step's loss.

Only the new state's keys are kept; everything else is released by the
scheduler as soon as it is used. The client reads nothing but a few floats
per step (the loss, from the small bias dicts of the last layer), so steps
are submitted ahead while earlier ones run.

**The training loop** (:func:`run_graph`) pipelines the steps, watches the
workers and replays after a lost worker. Steps are submitted ``lookahead``
ahead of the one whose loss the client waits for. Every wait is bounded: the
loop polls, checks that the grid's workers are still there, and gives up with
:class:`TimeoutError` when no step finished for ``timeout`` seconds.

Block tasks are pinned to their cells without fallback, so a task whose
worker died would wait forever; instead the watchdog notices the missing
worker, lays the same grid onto the workers there are now (sharing workers
if the cluster shrank) and replays the steps since the last state it holds
(the start, or the last checkpoint). Tasks are pure and every attempt has
its own key prefix, so the replayed steps give exactly the same numbers.
Training gives up with :class:`~daskann.exceptions.LostWorkersError` after
``max_recoveries`` replays from the same state; a replay that reaches a new
checkpoint renews the budget (see :mod:`daskann.npt._run`).
"""

from __future__ import annotations

import operator
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from daskann._dask_input import is_dask_array
from daskann.cluster import wait_watching, workers_left
from daskann.exceptions import DivergenceCause, WorkerLost
from daskann.nn import MLP
from daskann.npt import _kernels
from daskann.npt._run import (
    FinalState,
    HeldBlocks,
    Replays,
    RunRecord,
    RunSpec,
    RunStart,
    assembled_state,
    checkpoint_layout,
    data_block,
    graph_worker_times,
    layer_arrays,
)
from daskann.npt.cannon import TrafficLedger, add_product
from daskann.npt.grid import ProcessGrid, split_bounds
from daskann.npt.matrix import Block, GraphBuilder, GridMatrix, block_digests, blocks_to_dask, scatter_to
from daskann.store import write_block

# largest weight block (bytes) stored with its velocity under one key in fused mode
PACK_LIMIT = 64 * 2**10


class LocatedBlock(NamedTuple):
    """A block of a :class:`GridState` where it lives, named as a checkpoint store names it."""

    tag: str  # "w" weights, "v" their velocity, "b" a bias with its velocity (graph mode's {"b", "v"})
    layer: int
    arrays: tuple  # the checkpoint arrays of what it holds: one, or a bias's and its velocity's
    index: str  # "i.j" (or "j" for a bias) in those arrays
    region: tuple  # its bounds in those arrays
    key: str
    owner: str
    spec: Callable  # spec(the key's value): what :func:`_held` reads


@dataclass
class GridState(FinalState):
    """Parameters and velocities on the grid after ``step`` steps, read and saved where they live.

    A run's final state, as :class:`~daskann.npt.resident.ResidentState` (a
    :class:`~daskann.npt._run.FinalState`).
    """

    step: int
    weight_mats: list  # GridMatrix per layer
    velocity_mats: list  # GridMatrix per layer
    bias_blocks: list  # per layer, per grid column: Block of a dict {"b", "v"} on cell (0, j)
    futures: dict = field(default_factory=dict, repr=False)
    prefix: str = ""  # key prefix of the engine that made it: its saves' keys start with it

    def keys(self) -> list[str]:
        keys = []
        for w, v, b in zip(self.weight_mats, self.velocity_mats, self.bias_blocks, strict=True):
            keys += w.keys() + v.keys() + [blk.key for blk in b]
        return list(dict.fromkeys(keys))  # a packed block holds a weight and its velocity under one key

    def gather(self, settings: dict) -> tuple[MLP, list]:
        """Model and velocity on the client (``settings``: activation, output, negative_slope)."""
        values = dict(zip(self.futures, self.client.gather(list(self.futures.values())), strict=True))

        def blocks():
            for located in self._located_blocks():
                for array, block in _held(located.arrays, located.spec(values[located.key])):
                    yield array, located.region, block

        sizes = [W.shape[0] for W in self.weight_mats] + [self.weight_mats[-1].shape[1]]
        return assembled_state(sizes, self.weight_mats[0].dtype, blocks(), settings)

    def save(self, tmp, gather=None) -> dict:
        """Every block written into the open checkpoint store ``tmp`` by its cell: ``{array: {"i.j": sha256}}``.

        ``gather`` (futures -> values, the client's by default) lets training bound and watch the wait.
        """
        tmp = str(tmp)
        builder = GraphBuilder(self.client, f"{self.prefix}-save{self.step}-{uuid.uuid4().hex[:6]}")
        tasks = self._task_per_block(
            builder, lambda arrays, index, region, spec: (_save, tmp, arrays, index, region, spec)
        )
        keys = [key for _, key in tasks]
        futures = builder.submit(keys, keep=self.futures)
        return block_digests((gather or self.client.gather)([futures[k] for k in keys]))

    def all_finite(self) -> tuple[bool, bool]:
        """(all weights and biases finite, all velocities finite), checked where they live."""
        builder = GraphBuilder(self.client, f"{self.prefix}-finite{self.step}-{uuid.uuid4().hex[:6]}")
        tasks = self._task_per_block(builder, lambda arrays, index, region, spec: (_kernels.all_finite, spec))
        futures = builder.submit([key for _, key in tasks], keep=self.futures)
        ok = dict.fromkeys("wvb", True)
        for (tag, _), finite in zip(tasks, self.client.gather([futures[key] for _, key in tasks]), strict=True):
            ok[tag] = ok[tag] and bool(finite)
        return ok["w"] and ok["b"], ok["v"]

    def _task_per_block(self, builder: GraphBuilder, task) -> list[tuple[str, str]]:
        """A task on the cell of every block, layer by layer: ``[(tag, key)]``, tag "w", "v" or "b".

        ``task(arrays, index, region, value)`` gives ``(func, *args)`` for a :class:`LocatedBlock`,
        ``value`` the task's argument that gives what it holds.
        """
        tasks = []
        for tag, layer, arrays, index, region, key, owner, spec in self._located_blocks():
            name = f"{builder.name}-{tag}{layer}-{index.replace('.', '-')}"
            args = task(arrays, index, region, spec(builder.ref(key)))
            tasks.append((tag, builder.add(name, *args, owner=owner)))
        return tasks

    def _located_blocks(self):
        """Every block where it lives, layer by layer (:class:`LocatedBlock`)."""
        for layer, (W, V, line) in enumerate(zip(self.weight_mats, self.velocity_mats, self.bias_blocks, strict=True)):
            weights, weight_velocity, biases, bias_velocity = layer_arrays(layer)
            for tag, array, mat in (("w", weights, W), ("v", weight_velocity, V)):
                for i, r in enumerate(mat.row_bounds):
                    for j, c in enumerate(mat.col_bounds):
                        blk = mat.blocks[i][j]
                        yield LocatedBlock(tag, layer, (array,), f"{i}.{j}", (r, c), blk.key, mat.owner(i, j), blk.spec)
            for j, (blk, c) in enumerate(zip(line, W.col_bounds, strict=True)):
                owner = W.grid.owner(0, j)
                yield LocatedBlock("b", layer, (biases, bias_velocity), str(j), (c,), blk.key, owner, _whole)

    def weights(self) -> list:
        """One dask array per layer whose chunks are the blocks, read where they live."""
        return [mat.to_dask() for mat in self.weight_mats]

    def biases(self) -> list:
        """One dask array per layer, one chunk per grid column (on its column's first cell)."""
        return [
            blocks_to_dask(
                f"{line[0].key}-dask-{uuid.uuid4().hex[:6]}",
                [self.futures[blk.key] for blk in line],
                {(j,): (j, operator.getitem, blk.field) for j, blk in enumerate(line)},
                (tuple(blk.shape[1] for blk in line),),
                W.dtype,
            )
            for W, line in zip(self.weight_mats, self.bias_blocks, strict=True)
        ]


@dataclass
class DataBands:
    """A data set on the grid, scattered once.

    ``X`` is cut into one column band per grid column, each on one worker
    (minibatch blocks are cut from it every step). Float targets are small
    next to ``X`` and copied to where the loss needs them: the band of
    output columns ``j`` to every worker of grid column ``j`` (MSE on a
    linear output), or all of ``y`` to the first worker of every grid row
    (the row-panel loss, and class labels).
    """

    x_bands: list  # Block per grid column of the input
    x_owners: list
    y_keys: list  # [i][j]: key of the targets the loss task of cell (i, j) reads, or None
    n_samples: int
    futures: dict = field(default_factory=dict, repr=False)


class GraphEngine:
    """Builds and submits the task graphs of graph-mode training on one grid.

    Parameters
    ----------
    client : distributed.Client
    grid : ProcessGrid
    sizes : tuple of int
        Layer widths of the network.
    settings : dict
        Validated trainer settings.
    prefix : str
        Per-run (and per-attempt) key prefix.
    chains : {0, 1, 2}
        Tasks per output block of a product: 0 one fused task, 1 or 2 accumulation chains
        (see :mod:`daskann.npt.cannon`).
    """

    def __init__(self, client, grid: ProcessGrid, *, sizes, settings: dict, prefix: str, chains: int = 2):
        self.client = client
        self.grid = grid
        self.sizes = tuple(sizes)
        self.settings = settings
        self.prefix = prefix
        self.chains = chains
        self.dtype = np.dtype(settings["dtype"])
        self.n_layers = len(self.sizes) - 1
        self.panel_loss = not (settings["loss"] == "mse" and settings["output"] == "linear")
        self.col_bounds = [split_bounds(n, grid.cols) for n in self.sizes]
        self.row_bounds = [split_bounds(n, grid.rows) for n in self.sizes]
        # tiny blocks in one task per product: a weight block and its velocity under one key, updated by the
        # task that finishes the weight gradient (no update task); larger ones keep two keys, so that a
        # weight block borrowed for a product moves without its velocity
        self.packed = chains == 0 and self._largest_weight_block() <= PACK_LIMIT
        self.ledgers: dict[int, int] = {}

    # -- placement ------------------------------------------------------------------
    def band_owner(self, j: int) -> str:
        """Worker holding column band ``j`` of ``X``: spread down the grid columns."""
        return self.grid.owner(j % self.grid.rows, j)

    # -- moving state in and out ----------------------------------------------------
    def scatter_data(self, X, y, *, name: str = "data") -> DataBands:
        """The column bands of ``X``, and the targets the loss tasks read, on their workers.

        numpy data is cut on the client and scattered; a persisted dask array is cut on the
        workers, one task per band on its owner that reads only the chunks it overlaps, so the
        client holds no data at all. Float targets are small next to ``X``: band ``j`` of the
        output columns goes to every worker of grid column ``j`` (MSE on a linear output);
        otherwise all targets, or all class labels, go to the first worker of every grid row.
        """
        lazy, grid = is_dask_array(X), self.grid
        if not lazy and self.settings["loss"] == "cross_entropy":
            y = np.asarray(y, dtype=np.int64)
        values, where, futures = {}, {}, {}

        def place(key: str, owner: str, array, cols) -> None:
            block = data_block(self.client, array, None, cols, key=key, worker=owner)
            if lazy:
                futures[key] = block
            else:
                values[key] = block
                where.setdefault(owner, []).append(key)

        x_bands, x_owners = [], []
        for j, bounds in enumerate(self.col_bounds[0]):
            key, owner = f"{self.prefix}-{name}-X-{j}", self.band_owner(j)
            place(key, owner, X, bounds)
            x_bands.append(Block(key, (X.shape[0], bounds[1] - bounds[0])))
            x_owners.append(owner)
        whole = self.panel_loss or self.settings["loss"] == "cross_entropy"
        y_keys = [[None] * grid.cols for _ in range(grid.rows)]
        for i in range(grid.rows):
            for j, bounds in enumerate(self.col_bounds[-1][: 1 if whole else None]):
                owner = grid.owner(i, j)
                key = f"{self.prefix}-{name}-y-{'all' if whole else j}-{grid.workers.index(owner)}"
                if key not in values and key not in futures:
                    place(key, owner, y, None if whole else bounds)
                y_keys[i][j] = key
        futures |= scatter_to(self.client, values, where)
        return DataBands(x_bands, x_owners, y_keys, X.shape[0], futures)

    def start_state(self, start: RunStart) -> GridState:
        """The state ``start`` names, on the cells (``start.state``, already there, as it is).

        Seeded blocks (:mod:`daskann.nn._init`) and the blocks of a checkpoint store (of any grid, or
        a single process) are computed, or read and verified, by a task on each block's owner that
        takes only the seed or the path and the block's bounds: no weight passes through the client.
        A model and velocity the client holds are cut there and scattered block by block.
        """
        source = start.block_source(self.sizes, self.dtype)
        if source is None:
            return start.state
        name = f"{self.prefix}-{source.tag}" + ("" if start.from_seed else str(start.step))
        builder = GraphBuilder(self.client, name)
        on_client = isinstance(source, HeldBlocks)
        values, where = {}, {}

        def place(key: str, owner: str, func, *args) -> None:
            if key in values or key in builder.tasks:  # a packed block serves the weights and the velocity
                return
            if on_client:
                values[key] = func(source, *args)
                where.setdefault(owner, []).append(key)
            else:
                builder.add(key, func, source, *args, owner=owner)

        kinds = (("wv", "w"), ("wv", "v")) if self.packed else (("w", None), ("v", None))
        mats, biases = ([], []), []
        for layer in range(self.n_layers):
            rows, cols = self.row_bounds[layer], self.col_bounds[layer + 1]
            for out, (kind, field_name) in zip(mats, kinds, strict=True):
                blocks = []
                for i, r in enumerate(rows):
                    line = []
                    for j, c in enumerate(cols):
                        key = f"{name}-{kind}{layer}-{i}-{j}"
                        place(key, self.grid.owner(i, j), _read_weight, layer, r, c, kind)
                        size = (r[1] - r[0], c[1] - c[0])
                        line.append(self._packed_block(key, size, field_name) if self.packed else Block(key, size))
                    blocks.append(line)
                out.append(GridMatrix(self.grid, self.sizes[layer : layer + 2], self.dtype, rows, cols, blocks))
            line = []
            for j, c in enumerate(cols):
                key = f"{name}-b{layer}-{j}"
                place(key, self.grid.owner(0, j), _read_bias, layer, c)
                line.append(Block(key, (1, c[1] - c[0]), field="b"))
            biases.append(line)
        state = GridState(start.step, *mats, biases)
        futures = scatter_to(self.client, values, where) if on_client else builder.submit(state.keys())
        return self._attach(state, futures)

    def store_layout(self) -> dict:
        """The arrays of a checkpoint of this net (:func:`daskann.store.write_block_group`), cut on the grid."""
        return checkpoint_layout(self.sizes, self.dtype, lambda k: (self.row_bounds[k], self.col_bounds[k + 1]))

    def _largest_weight_block(self) -> int:
        """Bytes of the largest weight block on the grid."""
        return max(
            (r1 - r0) * (c1 - c0) * self.dtype.itemsize
            for layer in range(self.n_layers)
            for r0, r1 in self.row_bounds[layer]
            for c0, c1 in self.col_bounds[layer + 1]
        )

    @staticmethod
    def _packed_block(key: str, shape, field: str) -> Block:
        # the stored dict moves whole: twice the bytes of the block (for the traffic count)
        return Block(key, shape, field=field, stored=(2 * shape[0], shape[1]))

    def _attach(self, state: GridState, futures: dict) -> GridState:
        state.futures, state.prefix = {k: futures[k] for k in state.keys()}, self.prefix
        for mat in state.weight_mats + state.velocity_mats:
            mat.futures = {k: state.futures[k] for k in mat.keys()}
        return state

    # -- one training step ------------------------------------------------------------
    def submit_step(self, state: GridState, data: DataBands, rows: np.ndarray) -> tuple[GridState, list]:
        """Submit step ``state.step``; returns the new state and the futures carrying the loss."""
        s = self.settings
        step = state.step
        name = f"{self.prefix}-s{step}"
        builder = GraphBuilder(self.client, name)
        ledger = TrafficLedger()
        Z, A0 = self._forward(builder, ledger, state, data, rows, name, with_grad=True)
        dZ, y_keep = self._loss(builder, ledger, data, rows, Z[-1], name, with_grad=True)
        act = (s["activation"], s["negative_slope"])
        backward = _kernels.ActivationBackward(*act)
        new_w, new_v, new_b = [None] * self.n_layers, [None] * self.n_layers, [None] * self.n_layers
        for layer in range(self.n_layers - 1, -1, -1):
            W, V = state.weight_mats[layer], state.velocity_mats[layer]
            A_prev = A0 if layer == 0 else Z[layer - 1].activated(*act)
            if layer > 0:
                Zp = Z[layer - 1]
                dZ_prev = add_product(
                    builder,
                    dZ,
                    W,
                    name=f"{name}-d{layer}",
                    trans_b=True,
                    out_rows=Zp.row_bounds,
                    out_cols=Zp.col_bounds,
                    chains=self.chains,
                    finish=lambda i, j, Zp=Zp: (backward, [Zp.blocks[i][j].spec(builder.ref(Zp.blocks[i][j].key))]),
                    ledger=ledger,
                )
            new_w[layer], new_v[layer] = self._weight_updates(
                builder, ledger, W, V, A_prev, dZ, f"{name}-g{layer}", f"{name}-w{layer}"
            )
            new_b[layer] = self._bias_updates(builder, ledger, state.bias_blocks[layer], dZ, layer, name)
            if layer > 0:
                dZ = dZ_prev
        new = GridState(step + 1, new_w, new_v, new_b)
        futures = builder.submit(new.keys(), keep=[state.futures, data.futures, y_keep])
        self.ledgers[step] = ledger.bytes
        new = self._attach(new, futures)
        loss_futures = [new.futures[blk.key] for blk in new.bias_blocks[-1]]
        return new, loss_futures

    def _weight_updates(self, builder, ledger, W, V, A_prev, dZ, grad_name: str, update_name: str):
        """A layer's new weights and velocity, from its gradient ``A_prev.T @ dZ``.

        Two keys per block, so that a weight block borrowed for a product moves without its velocity.
        """
        if self.packed:
            return self._packed_weight_updates(builder, ledger, W, V, A_prev, dZ, grad_name)

        velocity = _kernels.Velocity(self.settings["momentum"])

        def finish(i, j):
            return velocity, [V.blocks[i][j].spec(builder.ref(V.blocks[i][j].key))]

        Vn = self._gradient_product(builder, ledger, W, A_prev, dZ, grad_name, finish)
        return self._stepped_weights(builder, W, Vn, update_name), Vn

    def _gradient_product(self, builder, ledger, W, A_prev, dZ, grad_name: str, finish) -> GridMatrix:
        """``A_prev.T @ dZ`` on ``W``'s blocks, each block's sum ending as ``finish(i, j)`` says."""
        return add_product(
            builder,
            A_prev,
            dZ,
            name=grad_name,
            trans_a=True,
            out_rows=W.row_bounds,
            out_cols=W.col_bounds,
            chains=self.chains,
            finish=finish,
            ledger=ledger,
        )

    def _packed_weight_updates(self, builder, ledger, W, V, A_prev, dZ, grad_name: str) -> list:
        """``[new weights, new velocity]``, both from one task per block whose epilogue is the whole SGD update."""
        step = _kernels.SGDStep(self.settings["lr"], self.settings["momentum"])

        def finish(i, j):
            return step, [
                V.blocks[i][j].spec(builder.ref(V.blocks[i][j].key)),
                W.blocks[i][j].spec(builder.ref(W.blocks[i][j].key)),
            ]

        P = self._gradient_product(builder, ledger, W, A_prev, dZ, grad_name, finish)
        return [
            GridMatrix(
                self.grid,
                W.shape,
                self.dtype,
                W.row_bounds,
                W.col_bounds,
                [
                    [self._packed_block(P.blocks[i][j].key, P.blocks[i][j].shape, kind) for j in range(self.grid.cols)]
                    for i in range(self.grid.rows)
                ],
            )
            for kind in ("w", "v")
        ]

    def _stepped_weights(self, builder, W, Vn, update_name: str) -> GridMatrix:
        """The weights after the SGD step by velocity ``Vn``: a task per block, on the block's cell."""
        s = self.settings
        blocks = []
        for i in range(self.grid.rows):
            line = []
            for j in range(self.grid.cols):
                key = builder.add(
                    f"{update_name}-{i}-{j}",
                    _kernels.weight_update,
                    builder.ref(W.blocks[i][j].key),
                    builder.ref(Vn.blocks[i][j].key),
                    s["lr"],
                    owner=self.grid.owner(i, j),
                )
                line.append(Block(key, W.blocks[i][j].shape))
            blocks.append(line)
        return GridMatrix(self.grid, W.shape, self.dtype, W.row_bounds, W.col_bounds, blocks)

    def _forward(self, builder, ledger, state, data, rows, name, *, with_grad: bool):
        s = self.settings
        grid = self.grid
        batch_bounds = split_bounds(len(rows), grid.rows)
        # the minibatch, cut from the data's column bands where they live
        blocks, placement = [], []
        for i, (r0, r1) in enumerate(batch_bounds):
            line, where = [], []
            for k, band in enumerate(data.x_bands):
                key = builder.add(
                    f"{name}-x-{i}-{k}", _kernels.take_rows, builder.ref(band.key), rows[r0:r1], owner=data.x_owners[k]
                )
                line.append(Block(key, (r1 - r0, band.shape[1])))
                where.append(data.x_owners[k])
            blocks.append(line)
            placement.append(where)
        A = GridMatrix(
            grid, (len(rows), self.sizes[0]), self.dtype, batch_bounds, self.col_bounds[0], blocks, placement=placement
        )
        A0 = A
        Z = []
        for layer in range(self.n_layers):
            bias = state.bias_blocks[layer]
            if layer == self.n_layers - 1 and not self.panel_loss:
                # MSE on a linear output: each output block's last task also gives its loss gradient
                scale = 2.0 / (len(rows) * self.sizes[-1])

                def finish(i, j, scale=scale, bias=bias):
                    r0, r1 = batch_bounds[i]
                    epilogue = _kernels.BiasMSE(scale, rows[r0:r1], with_grad)
                    return epilogue, [bias[j].spec(builder.ref(bias[j].key)), builder.ref(data.y_keys[i][j])]
            else:

                def finish(i, j, bias=bias):
                    return _kernels.add_bias, [bias[j].spec(builder.ref(bias[j].key))]

            Zl = add_product(
                builder,
                A,
                state.weight_mats[layer],
                name=f"{name}-f{layer}",
                out_rows=batch_bounds,
                out_cols=self.col_bounds[layer + 1],
                chains=self.chains,
                finish=finish,
                ledger=ledger,
            )
            for i in range(grid.rows):
                for j in range(grid.cols):
                    ledger.fetch(
                        bias[j].key, grid.owner(0, j), grid.owner(i, j), 2 * bias[j].shape[1] * self.dtype.itemsize
                    )
            Z.append(Zl)
            A = Zl.activated(s["activation"], s["negative_slope"])
        return Z, A0

    def _loss(self, builder, ledger, data, rows, ZL, name, *, with_grad: bool):
        """Loss partials and ``dZ`` of the output layer; returns (dZ GridMatrix, futures to keep)."""
        s = self.settings
        grid = self.grid
        n_batch, n_out = len(rows), self.sizes[-1]
        batch_bounds = ZL.row_bounds
        blocks = []
        if not self.panel_loss:
            # computed by the output layer's forward tasks (epilogue BiasMSE)
            blocks = [[Block(b.key, b.shape, field="g") for b in line] for line in ZL.blocks]
        else:
            for i, (r0, r1) in enumerate(batch_bounds):
                owner = grid.owner(i, 0)
                z_specs = [ZL.blocks[i][j].spec(builder.ref(ZL.blocks[i][j].key)) for j in range(grid.cols)]
                for j in range(1, grid.cols):
                    ledger.fetch(
                        ZL.blocks[i][j].key,
                        grid.owner(i, j),
                        owner,
                        int(np.prod(ZL.blocks[i][j].shape)) * self.dtype.itemsize,
                    )
                target = (builder.ref(data.y_keys[i][0]), rows[r0:r1])
                key = builder.add(
                    f"{name}-loss-{i}",
                    _kernels.loss_panel,
                    z_specs,
                    target,
                    loss=s["loss"],
                    n_batch=n_batch,
                    size=n_batch * n_out,
                    with_grad=with_grad,
                    owner=owner,
                )
                line = [
                    Block(key, (r1 - r0, c1 - c0), field="g", window=(0, r1 - r0, c0, c1), stored=(r1 - r0, n_out))
                    for (c0, c1) in ZL.col_bounds
                ]
                blocks.append(line)
        placement = [[grid.owner(i, 0)] * grid.cols for i in range(grid.rows)] if self.panel_loss else None
        dZ = GridMatrix(grid, ZL.shape, self.dtype, ZL.row_bounds, ZL.col_bounds, blocks, placement=placement)
        return dZ, data.futures

    def _bias_updates(self, builder, ledger, biases, dZ, layer, name):
        s = self.settings
        grid = self.grid
        last = layer == self.n_layers - 1
        out = []
        for j, blk in enumerate(biases):
            owner = grid.owner(0, j)
            specs = [dZ.blocks[i][j].spec(builder.ref(dZ.blocks[i][j].key)) for i in range(grid.rows)]
            for i in range(grid.rows):
                b = dZ.blocks[i][j]
                ledger.fetch(b.key, dZ.owner(i, j), owner, int(np.prod(b.stored_shape)) * self.dtype.itemsize)
            collect = last and (not self.panel_loss or j == 0)
            key = builder.add(
                f"{name}-b{layer}-{j}",
                _kernels.bias_update,
                builder.ref(blk.key),
                specs,
                s["lr"],
                s["momentum"],
                collect,
                owner=owner,
            )
            out.append(Block(key, blk.shape, field="b"))
        return out

    # -- validation on the grid -----------------------------------------------------------
    def submit_eval(self, state: GridState, data: DataBands, tag: str) -> list:
        """Forward pass over a whole (validation) set; futures of small dicts with loss partials."""
        rows = np.arange(data.n_samples)
        name = f"{self.prefix}-eval{state.step}-{tag}"
        builder = GraphBuilder(self.client, name)
        ledger = TrafficLedger()
        Z, _ = self._forward(builder, ledger, state, data, rows, name, with_grad=False)
        dZ, _ = self._loss(builder, ledger, data, rows, Z[-1], name, with_grad=False)
        keys = sorted({b.key for line in dZ.blocks for b in line})
        futures = builder.submit(keys, keep=[state.futures, data.futures])
        return [futures[k] for k in keys]

    def eval_values(self, parts: list, n_samples: int) -> dict:
        """``val_loss`` (and ``val_accuracy``) from the gathered partials of :meth:`submit_eval`."""
        correct = sum(p.get("correct", 0) for p in parts)
        return _kernels.validation_scores(
            sum(p["loss"] for p in parts), correct, self.settings["loss"], n_samples, self.sizes[-1]
        )

    def loss_value(self, parts: list, n_batch: int) -> float:
        """The step's mean loss from the last layer's bias dicts."""
        total = sum(p["loss"] for p in parts if "loss" in p)
        return _kernels.mean_loss(total, self.settings["loss"], n_batch, self.sizes[-1])


def _read_weight(source, layer: int, rows, cols, kind: str):
    """A weight block (``"w"``), its velocity (``"v"``) or both packed (``"wv"``) read from a block source."""
    weights, velocity, _, _ = layer_arrays(layer)
    if kind == "wv":
        return {"w": source.read(weights, (rows, cols)), "v": source.read(velocity, (rows, cols))}
    return source.read(weights if kind == "w" else velocity, (rows, cols))


def _read_bias(source, layer: int, cols) -> dict:
    """A bias block with its velocity, as graph mode stores it (``{"b", "v"}``), read from a block source."""
    _, _, biases, velocity = layer_arrays(layer)
    return {"b": source.read(biases, (cols,)), "v": source.read(velocity, (cols,))}


def _whole(value):
    """A bias block's value, read whole (its ``{"b", "v"}`` dict)."""
    return value


def _held(arrays, value) -> list:
    """What a located block holds, ``[(array, block)]``: a weight or velocity block (``value`` an operand
    spec), or a bias and its velocity (``value`` graph mode's ``{"b", "v"}``)."""
    if len(arrays) == 2:
        return [(arrays[0], value["b"]), (arrays[1], value["v"])]
    return [(arrays[0], _kernels.operand(value))]


def _save(tmp: str, arrays, index: str, region, value) -> list:
    """Write what a located block holds (:func:`_held`) into the open store ``tmp``."""
    return [(array, index, write_block(tmp, array, region, block)) for array, block in _held(arrays, value)]


# -- the training loop ---------------------------------------------------------------------------


@dataclass
class GraphResult:
    """What a try at a graph-mode run gives back: its history rows and final state, which stays on the grid."""

    rows: dict  # completed steps -> history row
    state: object = None  # the final GridState (after divergence, the last finite one), alive on the grid
    diverged: tuple[int, str] | None = None  # as RunRecord.diverged


def run_graph(client, run: RunSpec, start: RunStart, record: RunRecord) -> None:
    """Graph mode from ``start`` on ``record.grid``: its history rows, grid and final state go into ``record``.

    Trains steps ``start.step .. run.stop - 1``; see the module docstring.
    """
    held = [v.copy() for v in start.velocity] if start.velocity is not None else None
    rows: dict = {}
    t0 = time.perf_counter() - run.time_offset
    task_stream_start = time.time()
    client.get_task_stream(start=task_stream_start)  # makes the scheduler record from now on
    replays = Replays(client, record.grid, run, what="graph-mode training", budget="npt.graph-replays")

    def attempt(grid: ProcessGrid, begin: RunStart, number: int) -> GraphResult:
        for done in [d for d in rows if d > begin.step]:
            del rows[done]  # recorded by a try that did not finish: replayed from where this try begins
        return _Attempt(client, grid, run, begin, rows, prefix=f"{run.run_id}-a{number}", t0=t0).train()

    result = replays.run(replace(start, velocity=held), attempt)
    record.grid, record.recoveries, record.state = replays.grid, replays.tries, result.state
    record.worker_times.update(_add_timings(client, result.rows, run.run_id, task_stream_start, replays.grid))
    for done in sorted(result.rows):
        record.history.append(done, **result.rows[done])
    record.diverged = result.diverged


class _Attempt:
    """One try at the remaining steps on one grid, under its own key prefix.

    Raises :class:`WorkerLost` carrying the latest :class:`RunStart` (the last
    checkpoint reached) when a grid worker leaves.
    """

    def __init__(self, client, grid: ProcessGrid, run: RunSpec, start: RunStart, rows: dict, *, prefix: str, t0: float):
        self.run, self.rows, self.prefix, self.t0 = run, rows, prefix, t0
        self.start = start  # the state this attempt starts from: a diverged run may replay from it
        self.restart_from = start  # the latest state a replay restarts from: the start, then each checkpoint
        self.grid = grid
        self.engine = GraphEngine(
            client, grid, sizes=run.sizes, settings=run.settings, prefix=prefix, chains=run.chains
        )
        self.watch = _Watchdog(client, grid, run.timeout)
        self.states: dict = {}  # steps done -> GridState
        self.pending: list = []  # (step, loss futures) submitted and not yet read

    def train(self) -> GraphResult:
        self._scatter()
        try:
            return self._steps()
        except WorkerLost as exc:
            raise WorkerLost(exc.args[0], self.restart_from) from exc
        finally:
            self.states.clear()
            self.pending.clear()

    def _scatter(self) -> None:
        """The data and the starting state onto the grid; a grid worker gone meanwhile means a replay."""
        run, engine, start = self.run, self.engine, self.start
        try:
            self.bands = engine.scatter_data(run.X, run.y)
            self.val_bands = (
                engine.scatter_data(run.validation[0], run.validation[1], name="val")
                if run.validation is not None
                else None
            )
            self.states[0 if start.from_seed else start.step] = engine.start_state(start)
        except OSError as exc:
            raise WorkerLost(f"scattering to the grid failed ({exc})", None) from exc
        except KeyError as exc:
            # the scheduler removed a grid worker between our look at the cluster and the scatter
            if exc.args and exc.args[0] in self.grid.workers:
                raise WorkerLost(f"grid worker {exc.args[0]} left while data was scattered to it", None) from exc
            raise

    def _steps(self) -> GraphResult:
        """Submit ahead, read each step's loss, record, checkpoint; the final state stays on the grid."""
        run = self.run
        next_step = done = self.start.step
        while done < run.stop:
            next_step = self._submit_ahead(next_step, done)
            step, loss_futures = self.pending.pop(0)
            loss = self.engine.loss_value(self._gather(loss_futures), run.order.batch_size)
            if not np.isfinite(loss):
                return self._diverged(step)
            done = step + 1
            self._record(done, loss)
            self._checkpoint(done)
            for old in [k for k in self.states if k <= done and k < next_step]:
                del self.states[old]  # saved or evaluated, and read by a submitted step
        final = self.states[run.stop]
        self.watch.wait(list(final.futures.values()), self.restart_from)  # done, nothing gathered
        return GraphResult(self.rows, state=final)

    def _submit_ahead(self, next_step: int, done: int) -> int:
        """Submit steps up to ``lookahead`` ahead of the last one read; the next step to submit.

        The client lets go of each state once the step that reads it is submitted (unless it is still
        to be saved or evaluated): each version of a cell's blocks, and the copies other cells fetched
        for their products, is freed as soon as the tasks that read it are done, however late the
        client reads the losses.
        """
        run = self.run
        keep = run.checkpoint_steps | run.eval_steps
        while next_step < run.stop and next_step - done <= run.lookahead:
            new, loss_futures = self.engine.submit_step(
                self.states[next_step], self.bands, run.order.indices(next_step)
            )
            if next_step not in keep:
                del self.states[next_step]
            self.states[next_step + 1] = new
            self.pending.append((next_step, loss_futures))
            next_step += 1
        return next_step

    def _record(self, done: int, loss: float) -> None:
        """The history row after ``done`` steps (validated at evaluation steps)."""
        engine = self.engine
        row = {
            "loss": loss,
            "time": time.perf_counter() - self.t0,
            "bytes_moved": float(engine.ledgers[done - 1]),
            "_attempt": self.prefix,
        }
        if done in self.run.eval_steps and self.val_bands is not None:
            parts = self._gather(engine.submit_eval(self.states[done], self.val_bands, "val"))
            row.update(engine.eval_values(parts, self.val_bands.n_samples))
        self.rows[done] = row
        if self.run.progress is not None:
            self.run.progress(done, loss)

    def _checkpoint(self, done: int) -> None:
        """Save the state after ``done`` steps if asked; it becomes the state replays restart from."""
        run = self.run
        if done not in run.checkpoint_steps or run.on_checkpoint is None:
            return
        # each cell writes its blocks; the client commits the store once every digest is back, waiting as for a
        # step: a grid worker lost here means a replay, not an error
        state = self.states[done]
        # the history beside it: each row without the attempt that recorded it (a key of the task timings)
        rows = {d: {k: v for k, v in row.items() if k != "_attempt"} for d, row in self.rows.items()}
        path = run.on_checkpoint(
            done, self.engine.store_layout(), lambda tmp: state.save(tmp, gather=self._gather), rows
        )
        self.restart_from = RunStart(done, path=path)

    def _gather(self, futures):
        return self.watch.gather(futures, self.restart_from)

    def _diverged(self, step: int) -> GraphResult:
        """Non-finite loss at ``step``: find the last finite state, as SerialTrainer keeps it."""
        rows = self.rows
        state = self._state(step)
        params_ok, velocity_ok = state.all_finite()
        # the last finite state stays on the grid, as a finished run's does: nothing is gathered here
        if params_ok or step - 1 < self.start.step:
            # serial stops at step + 1 on the loss, keeping the weights it started that step with
            what = DivergenceCause.of(loss=False).what
            return GraphResult(rows, state, (step + 1, what))
        # the update of the previous step already produced non-finite weights; its velocity (momentum times
        # the last one plus the gradient) stands in for the gradients, which graph mode does not keep
        rows.pop(step, None)
        what = DivergenceCause.of(gradients=velocity_ok, weights=False).what
        return GraphResult(rows, self._state(step - 1), (step, what))

    def _state(self, step: int):
        """The state after ``step`` steps: held, or trained again from the latest saved state before it.

        The client keeps no state a submitted step has read (see :meth:`_submit_ahead`); steps are pure,
        so the replay gives the same numbers. Only a diverged run pays for it.
        """
        if step in self.states:
            return self.states[step]
        start = self.restart_from if self.restart_from.step <= step else self.start
        quiet = replace(
            self.run, stop=step, eval_steps=frozenset(), checkpoint_steps=frozenset(), on_checkpoint=None, progress=None
        )
        replay = _Attempt(self.engine.client, self.grid, quiet, start, {}, prefix=f"{self.prefix}-replay", t0=self.t0)
        return replay.train().state


class _Watchdog:
    """Bounded waits that notice a lost grid worker instead of hanging on a pinned task."""

    def __init__(self, client, grid: ProcessGrid, timeout: float):
        self.client = client
        self.workers = set(grid.workers)
        self.timeout = timeout

    def missing(self) -> list[str]:
        return workers_left(self.client, sorted(self.workers))

    def raise_if_lost(self, restart_from, cause: BaseException | None = None) -> None:
        """Raise :class:`WorkerLost` (replay from ``restart_from``) if a grid worker left the cluster."""
        lost = self.missing()
        if lost:
            why = f" ({type(cause).__name__})" if cause is not None else ""
            raise WorkerLost(f"worker(s) {', '.join(lost)} left the cluster{why}", restart_from) from cause

    def gather(self, futures, restart_from):
        """The values of ``futures`` once :meth:`wait` saw them finish."""
        self.wait(futures, restart_from)
        try:
            return self.client.gather(futures)
        except Exception as exc:
            self.raise_if_lost(restart_from, exc)
            raise

    def wait(self, futures, restart_from) -> None:
        """Wait, bounded, for ``futures``; :class:`WorkerLost` if a grid worker left meanwhile."""
        deadline = time.monotonic() + self.timeout

        def look():
            if all(f.done() for f in futures):
                return True
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"graph-mode training: no step finished within timeout={self.timeout:g} s; the cluster may be "
                    "overloaded or a worker is stuck (raise timeout for very large blocks)"
                )
            return None

        wait_watching(futures, look, watch=lambda: self.raise_if_lost(restart_from))
        if any(f.status != "finished" for f in futures):
            self.raise_if_lost(restart_from)
            # a lost worker held scattered inputs: the tasks that need them are cancelled
            failed = next((f for f in futures if f.status == "cancelled"), None)
            failed = failed or next((f for f in futures if f.status == "error"), None)
            if failed is not None:
                failed.result()  # raises the task's error (a cancelled one: CancelledError)


_STEP_KEY = re.compile(r"^(?P<prefix>.+-a\d+)-s(?P<step>\d+)-")


def _attempt_number(prefix) -> int:
    return -1 if prefix is None else int(prefix.rsplit("-a", 1)[1])


def _add_timings(client, rows: dict, run_id: str, since: float, grid: ProcessGrid) -> dict:
    """Per-step compute and transfer seconds from the scheduler's task stream (per worker of the grid), added
    to ``rows``; returns the parts of each worker's step time (see :mod:`daskann.npt._run`)."""
    try:
        records = client.get_task_stream(start=since)
    except Exception:  # diagnostics only: a missing record leaves NaN in the history
        records = []
    compute: dict = defaultdict(float)
    comm: dict = defaultdict(float)
    # per worker: every interval of the attempt that finished, and when each of its steps ended there
    spans: dict = defaultdict(lambda: defaultdict(list))
    step_ends: dict = defaultdict(dict)
    final = max((row.get("_attempt") for row in rows.values()), default=None, key=_attempt_number)
    for rec in records:
        key = rec.get("key")
        if not isinstance(key, str) or not key.startswith(run_id):
            continue
        m = _STEP_KEY.match(key)
        if m is None:
            continue
        ident = (m.group("prefix"), int(m.group("step")))
        worker, latest = rec.get("worker"), m.group("prefix") == final
        for ss in rec.get("startstops", ()):
            span = ss["stop"] - ss["start"]
            if ss["action"] == "compute":
                compute[ident] += span
            elif ss["action"] == "transfer":
                comm[ident] += span
            if latest and worker is not None:
                spans[worker][ss["action"]].append((ss["start"], ss["stop"]))
                if ss["action"] == "compute":
                    step_ends[worker][ident[1]] = max(ss["stop"], step_ends[worker].get(ident[1], ss["stop"]))
    n_workers = max(len(set(grid.workers)), 1)
    for done, row in rows.items():
        ident = (row.pop("_attempt", None), done - 1)
        row["compute_time"] = compute[ident] / n_workers if ident in compute else float("nan")
        row["comm_time"] = comm.get(ident, 0.0) / n_workers if ident in compute else float("nan")
    return graph_worker_times(spans, step_ends)
