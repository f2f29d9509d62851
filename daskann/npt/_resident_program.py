"""A resident run's virtual grid (:class:`Layout`), what each worker's task is told (:class:`ResidentRun`) and
the training loop each worker runs for its cells on it.

One long-lived task per worker executes this program for every virtual cell
the worker hosts (one cell per worker unless cells share workers). All
products of a step run by Cannon's algorithm on the virtual ``q x q`` grid:

* forward ``Z = A @ W``: ``A`` (activations) and ``W`` both in place;
* ``dW = A.T @ dZ`` and ``dA = dZ @ W.T``: the transposed operand is skewed
  straight from where its untransposed blocks live, in one message;
* every product is a skew followed by ``q`` local GEMMs, each block passed on
  (left for the left operand, up for the right one) *before* the local GEMM,
  so the transfer overlaps the multiply.

Operands known early (weights at the start of the step, activations as soon as
the forward pass makes them) are skewed at once, off the critical path. The
bias gradient and the softmax row statistics are small all-gathers among the
workers of a grid column or row. Each worker announces its part of a step's
loss and the cause of divergence its numbers give (a
:class:`~daskann.exceptions.DivergenceCause`, finite or not) to every worker
along with the next step's first blocks; the step is confirmed (or rolled back,
on divergence, naming the cause as SerialTrainer does) by all workers alike
before the next update, so no step waits on a barrier of its own.

At the evaluation steps of a run with validation data, the cells run one more
forward pass, by the same products, over their grid row's band of the
validation rows, and keep their share of the loss (and of the correctly
classified rows); the client adds up these numbers, never a block.

Arrays are never modified in place once made (updates build new arrays): a
block that was sent, or handed out as a result, stays valid.

Where each block lives (:class:`Layout`): Cannon's algorithm needs a square
grid, so a ``rows x cols`` process grid runs it on a virtual ``q x q`` grid
with ``q = lcm(rows, cols)`` (the generalised Cannon algorithm): virtual cell
``(I, J)`` belongs to process cell ``(I // (q // rows), J // (q // cols))``,
so every process cell holds the same number of virtual cells and the square
case is the plain algorithm.

Every matrix is cut into ``q x q`` blocks by :func:`split_bounds` of each of
its dimensions (uneven when ``q`` does not divide a size; a block may even be
empty). An activation ``(batch, n)`` block ``(I, J)`` and a weight ``(n_in,
n_out)`` block ``(K, J)`` sit on virtual cell ``(I, J)`` and ``(K, J)``; a
layer's output lands where the next layer's input must be.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

import numpy as np
from distributed import secede

from daskann._heap import heap_for_blocks
from daskann.exceptions import DivergenceCause
from daskann.nn import MLP
from daskann.nn._functional import activate, activation_backward
from daskann.npt._exchange import Channel
from daskann.npt._kernels import (
    all_finite,
    block_softmax,
    cross_entropy_block,
    mean_loss,
    ordered_sum,
    plus_bias,
    sgd_step,
    softmax_mse_delta,
    squared_error,
)
from daskann.npt._run import checkpoint_layout, layer_arrays
from daskann.npt.grid import ProcessGrid, split_bounds
from daskann.store import write_block


@dataclass(frozen=True)
class Layout:
    """Virtual Cannon grid over a process grid, and the block bounds of a net.

    Parameters
    ----------
    q : int
        Side of the virtual square grid.
    cell_workers : dict
        Worker address of each virtual cell ``(I, J)``.
    workers : tuple of str
        The distinct workers, in order of first appearance on the grid.
    batch : list of (start, stop)
        Row bounds of the minibatch.
    features : list of list of (start, stop)
        Column bounds of each layer width ``sizes[l]``.
    """

    q: int
    grid_shape: tuple[int, int]
    cell_workers: dict
    workers: tuple[str, ...]
    sizes: tuple[int, ...]
    batch_size: int
    batch: tuple
    features: tuple

    @classmethod
    def build(cls, grid: ProcessGrid, sizes, batch_size: int) -> Layout:
        q = math.lcm(grid.rows, grid.cols)
        row_group, col_group = q // grid.rows, q // grid.cols
        cell_workers = {(i, j): grid.owner(i // row_group, j // col_group) for i in range(q) for j in range(q)}
        workers = tuple(dict.fromkeys(grid.workers))
        return cls(
            q=q,
            grid_shape=(grid.rows, grid.cols),
            cell_workers=cell_workers,
            workers=workers,
            sizes=tuple(int(s) for s in sizes),
            batch_size=int(batch_size),
            batch=tuple(split_bounds(batch_size, q)),
            features=tuple(tuple(split_bounds(n, q)) for n in sizes),
        )

    @property
    def n_layers(self) -> int:
        return len(self.sizes) - 1

    def cells_of(self, worker: str) -> list[tuple[int, int]]:
        """Virtual cells hosted by ``worker``, row-major."""
        return [c for c, w in self.cell_workers.items() if w == worker]

    def process_cell(self, cell) -> tuple[int, int]:
        rows, cols = self.grid_shape
        return cell[0] // (self.q // rows), cell[1] // (self.q // cols)

    def describe(self, cell) -> str:
        """Human name of a virtual cell for error messages."""
        text = f"cell {self.process_cell(cell)}"
        if self.q != self.grid_shape[0] or self.q != self.grid_shape[1]:
            text += f" (virtual block {tuple(cell)})"
        return f"{text} on worker {self.cell_workers[tuple(cell)]}"

    # -- blocks of full arrays -------------------------------------------------
    def blocks(self, worker: str, source) -> dict:
        """``W``, ``vW``, ``b``, ``vb`` of ``worker``'s cells read from a block source.

        ``source`` is one of :mod:`daskann.npt._run`'s block sources: the seeded initialisation, a
        checkpoint store of any grid or mode (each block re-cut from the written blocks it overlaps,
        and verified), or a model the client holds.
        """
        cells = self.cells_of(worker)
        columns = sorted({j for _, j in cells})
        parts = {"W": {}, "vW": {}, "b": {}, "vb": {}}
        for k in range(self.n_layers):
            for name, places in (("W", cells), ("vW", cells), ("b", columns), ("vb", columns)):
                for where in places:
                    array, _, region = self._placed(name, k, where)
                    parts[name][k, where] = source.read(array, region)
        return parts

    def named_blocks(self, parts: dict):
        """The blocks of ``parts`` (some of ``W``, ``vW``, ``b``, ``vb``, keyed as :meth:`blocks` keys them)
        as a checkpoint names them: ``(array, "i.j" or "j", region, block)``, the inverse of :meth:`blocks`."""
        for name, held in parts.items():
            for (k, where), block in held.items():
                yield *self._placed(name, k, where), block

    def reported_by(self, worker: str, parts: dict) -> dict:
        """The blocks of ``parts`` (keyed as :meth:`blocks` keys them) that only ``worker`` reports: its cells'
        weights, and the biases of the columns whose row-0 cell it hosts (every bias block comes back once)."""
        top = {j for i, j in self.cells_of(worker) if i == 0}
        # blocks are never modified in place (updates make new arrays): no copies needed
        return {
            name: {key: block for key, block in held.items() if name in ("W", "vW") or key[1] in top}
            for name, held in parts.items()
        }

    def _placed(self, name: str, k: int, where) -> tuple:
        """Where block ``where`` (a cell, or a column for a bias) of ``name`` in layer ``k`` lies in a checkpoint:
        ``(array, "i.j" or "j", region)``."""
        array = layer_arrays(k)[("W", "vW", "b", "vb").index(name)]
        if name in ("W", "vW"):
            i, j = where
            return array, f"{i}.{j}", (self.features[k][i], self.features[k + 1][j])
        return array, str(where), (self.features[k + 1][where],)

    def store_layout(self, dtype) -> dict:
        """The arrays of a checkpoint of this net cut into this layout's blocks (:class:`daskann.store.BlockArray`)."""
        return checkpoint_layout(self.sizes, dtype, lambda k: (self.features[k], self.features[k + 1]))


@dataclass(frozen=True)
class ResidentRun:
    """One validated resident stretch: what every worker's task is told (:func:`run_worker`).

    Attributes
    ----------
    run_id : str
        The caller's run prefix (named in errors).
    namespace : str
        Prefix of this stretch's task keys and message namespace.
    layout : Layout
        Blocks of every layer on the grid's cells.
    settings : dict
        The arithmetic's settings (``dtype`` as a name).
    order : daskann.data.BatchOrder
    start, stop : int
        Steps to train, ``start < stop``.
    timeout : float
        Seconds any block may take to arrive.
    eval_steps : tuple of int
        Step counts after which the model is kept as a snapshot.
    """

    run_id: str
    namespace: str
    layout: Layout
    settings: dict
    order: object
    start: int
    stop: int
    timeout: float
    eval_steps: tuple = ()

    @classmethod
    def build(cls, run_id, layout, settings, dtype, order, start, stop, timeout, eval_fn) -> ResidentRun:
        """The run of :func:`~daskann.npt.resident.train_resident`'s validated arguments, under a fresh namespace."""
        return cls(
            run_id=run_id,
            namespace=f"{run_id}-resident-{uuid.uuid4().hex[:10]}",
            layout=layout,
            settings={k: settings[k] for k in ("loss", "output", "activation", "negative_slope", "lr", "momentum")}
            | {"dtype": np.dtype(dtype).name},
            order=order,
            start=start,
            stop=stop,
            timeout=timeout,
            eval_steps=tuple(d for d in range(start + 1, stop + 1) if eval_fn is not None and eval_fn(d)),
        )


def run_worker(run: ResidentRun, payload: dict, previous: dict | None = None) -> dict:
    """Task body: train this worker's cells for ``run.start .. run.stop - 1``.

    The cells start from ``previous`` (the result of this worker's task in the stretch before,
    still in its memory) when given, else from what ``payload`` names.
    """
    # leave the thread pool: cells of other runs (or a busy worker) must not wait on us
    secede()
    channel = Channel(run.namespace, timeout=run.timeout)
    try:
        with heap_for_blocks():
            if previous is not None:
                payload = payload | previous["state"]
            program = SingleCellProgram if run.layout.q == 1 else CellProgram
            result = program(run, payload, channel).run()
            channel.check_sends(wait=True)
        return result
    except BaseException as exc:
        channel.abort_peers(
            run.layout.workers,
            f"resident run {run.namespace} stopped: worker {channel.address} failed with {exc!r}",
        )
        channel.close()
        raise


class CellProgram:
    """State and steps of all the virtual cells hosted by one worker."""

    def __init__(self, run: ResidentRun, payload: dict, channel: Channel):
        self.layout: Layout = run.layout
        self.q = self.layout.q
        self.channel = channel
        self.me = channel.address
        self.cells = self.layout.cells_of(self.me)
        self.rows = sorted({i for i, _ in self.cells})
        self.columns = sorted({j for _, j in self.cells})
        self.n_layers = self.layout.n_layers
        s = run.settings
        self.loss_name, self.output = s["loss"], s["output"]
        self.activation, self.slope = s["activation"], float(s["negative_slope"])
        self.dtype = np.dtype(s["dtype"])
        self.lr, self.momentum = float(s["lr"]), float(s["momentum"])
        self.order = run.order
        self.start, self.stop = int(run.start), int(run.stop)
        self.eval_steps = set(run.eval_steps)
        self.X = payload["X"]
        self.y = payload["y"]
        # validation blocks of the hosted cells (row band of the grid row, column band of the cell), if any
        self.Xv, self.yv = payload.get("Xv"), payload.get("yv")
        self.evaluations: dict = {}  # completed steps -> (loss part, correct rows) on the validation set
        if payload.get("source") is not None:
            # the seeded initialisation computed here, or a checkpoint of any grid or mode read here
            payload = payload | self.layout.blocks(self.me, payload["source"])
        self.W, self.vW = dict(payload["W"]), dict(payload["vW"])
        self.b, self.vb = dict(payload["b"]), dict(payload["vb"])
        workers = self.layout.cell_workers
        q = self.q
        self.row_workers = {i: sorted({workers[(i, j)] for j in range(q)}) for i in range(q)}
        self.col_workers = {j: sorted({workers[(i, j)] for i in range(q)}) for j in range(q)}
        self.worker_index = self.layout.workers.index(self.me)
        self.compute = 0.0
        n_out = self.layout.sizes[-1]
        self.loss_scale = self.layout.batch_size * (n_out if self.loss_name == "mse" else 1)

    # -- messaging -------------------------------------------------------------
    def send(self, cell, tag: str, array) -> None:
        self.channel.send(self.layout.cell_workers[cell], tag, array)

    def recv(self, tag: str, source) -> np.ndarray:
        layout = self.layout
        if isinstance(source, str):
            return self.channel.recv(tag, lambda: f"block {tag!r} from worker {source}", source)
        source = tuple(source)
        return self.channel.recv(
            tag, lambda: f"block {tag!r} from {layout.describe(source)}", layout.cell_workers[source]
        )

    def share_row(self, step: int, name: str, values: dict) -> dict:
        """All-gather along grid rows: ``values[(i, j)]`` goes to every worker of row ``i``.

        Returns ``{i: [part_0, ..., part_{q-1}]}`` for the rows this worker
        hosts, parts in column order so every worker combines them alike.
        """
        for (i, j), value in values.items():
            for address in self.row_workers[i]:
                self.channel.send(address, f"{step}|{name}|{i}|{j}", value)
        return {i: [self.recv(f"{step}|{name}|{i}|{k}", (i, k)) for k in range(self.q)] for i in self.rows}

    # -- Cannon ----------------------------------------------------------------
    def skew(self, step: int, pid: str, side: str, blocks: dict, *, transposed: bool) -> None:
        """Send each held block of an operand to the cell that multiplies it first."""
        q = self.q
        for (i, j), array in blocks.items():
            r, c, block = (j, i, array.T) if transposed else (i, j, array)
            dst = (r, (c - r) % q) if side == "L" else ((r - c) % q, c)
            self.send(dst, f"{step}|{pid}|{side}|0|{dst[0]},{dst[1]}", block)

    def cannon(self, step: int, products) -> dict:
        """Run skewed products ``(pid, left_transposed, right_transposed)`` in lockstep.

        Returns ``{pid: {cell: block of the product}}``.
        """
        q = self.q
        held = {}
        for pid, lt, rt in products:
            for cell in self.cells:
                i, j = cell
                k = (i + j) % q
                left = self.recv(f"{step}|{pid}|L|0|{i},{j}", (k, i) if lt else (i, k))
                right = self.recv(f"{step}|{pid}|R|0|{i},{j}", (j, k) if rt else (k, j))
                held[pid, cell] = (left, right)
        out = {}
        for s in range(q):
            more = s < q - 1
            if more:  # pass the blocks on first, so the transfer overlaps the GEMMs
                for (pid, (i, j)), (left, right) in held.items():
                    to_left, to_up = (i, (j - 1) % q), ((i - 1) % q, j)
                    self.send(to_left, f"{step}|{pid}|L|{s + 1}|{to_left[0]},{to_left[1]}", left)
                    self.send(to_up, f"{step}|{pid}|R|{s + 1}|{to_up[0]},{to_up[1]}", right)
                self.channel.flush()
            t0 = time.perf_counter()
            for key, (left, right) in held.items():
                if s == 0:
                    out[key] = left @ right
                else:
                    out[key] += left @ right
            self.compute += time.perf_counter() - t0
            if more:
                for pid, (i, j) in list(held):
                    held[pid, (i, j)] = (
                        self.recv(f"{step}|{pid}|L|{s + 1}|{i},{j}", (i, (j + 1) % q)),
                        self.recv(f"{step}|{pid}|R|{s + 1}|{i},{j}", ((i + 1) % q, j)),
                    )
        result: dict = {pid: {} for pid, _, _ in products}
        for (pid, cell), block in out.items():
            result[pid][cell] = block
        return result

    # -- one training step -------------------------------------------------------
    def inputs(self, step: int):
        """This step's input blocks and the batch rows of each grid row."""
        idx = self.order.indices(step)
        batch_rows = {i: idx[slice(*self.layout.batch[i])] for i in self.rows}
        t0 = time.perf_counter()
        A0 = {(i, j): self.X[j][batch_rows[i]] for i, j in self.cells}
        self.compute += time.perf_counter() - t0
        return A0, batch_rows

    def forward(self, step, A0: dict, *, grad: bool = True):
        """Pre-activations of every layer; with ``grad``, each input is also skewed for its weight gradient."""
        n = self.n_layers
        pre = []
        self.skew(step, "f0", "L", A0, transposed=False)
        if grad:
            self.skew(step, "gw0", "L", A0, transposed=True)
        for layer in range(n):
            Z = self.cannon(step, [(f"f{layer}", False, False)])[f"f{layer}"]
            t0 = time.perf_counter()
            for (_, j), block in Z.items():
                plus_bias(block, self.b[layer, j], fresh=True)  # the Cannon sum is this worker's own
            pre.append(Z)
            if layer < n - 1:
                A = {cell: activate(block, self.activation, self.slope) for cell, block in Z.items()}
                self.compute += time.perf_counter() - t0
                nxt = layer + 1
                self.skew(step, f"f{nxt}", "L", A, transposed=False)
                if grad:
                    self.skew(step, f"gw{nxt}", "L", A, transposed=True)
            else:
                self.compute += time.perf_counter() - t0
        return pre

    def targets(self, cell, batch_rows):
        i, j = cell
        if self.loss_name == "cross_entropy":
            return self.y[batch_rows[i]]
        return self.y[j][batch_rows[i]]

    def row_softmax(self, step, logits: dict) -> tuple[dict, dict]:
        """Each hosted grid row's maximum ``M`` and ``sum(exp(z - M))`` over the whole row of ``logits``.

        Combined from each block's row maximum ``m`` and ``sum(exp(z - m))``, all-gathered along the row.
        """
        t0 = time.perf_counter()
        stats = {}
        for (i, j), z in logits.items():
            m = z.max(axis=1, initial=-np.inf)
            stats[i, j] = np.stack([m, np.exp(z - m[:, None]).sum(axis=1)])
        self.compute += time.perf_counter() - t0
        parts = self.share_row(step, "sm", stats)
        t0 = time.perf_counter()
        row_max, row_sum = {}, {}
        for i, pieces in parts.items():
            M = pieces[0][0].copy()
            for p in pieces[1:]:
                np.maximum(M, p[0], out=M)
            S = np.zeros_like(M)
            for p in pieces:
                S += p[1] * np.exp(p[0] - M)
            row_max[i], row_sum[i] = M, S
        self.compute += time.perf_counter() - t0
        return row_max, row_sum

    def output_loss(self, step, logits: dict, targets: dict, *, with_grad: bool = True):
        """Partial loss of this worker's cells, ``d loss / d logits`` per cell (with ``with_grad``) and
        the hosted grid rows' maxima of the logits (none for MSE on linear outputs).

        ``targets[cell]`` holds the cell's rows of the targets (for cross-entropy, the labels of
        its grid row). Row-wise softmax pieces are combined across a grid row from each block's row
        maximum ``m`` and ``sum(exp(z - m))``; MSE on softmax outputs then needs one more row sum.
        """
        linear = self.loss_name == "mse" and self.output == "linear"
        row_max, row_sum = ({}, {}) if linear else self.row_softmax(step, logits)
        t0 = time.perf_counter()
        scale = 2.0 / self.loss_scale if with_grad else None
        n_rows = self.layout.batch_size if with_grad else None
        partial, grads, probs, dots = 0.0, {}, {}, {}
        for (i, j), z in logits.items():
            if self.loss_name == "cross_entropy":
                partial, grads[i, j] = cross_entropy_block(
                    partial,
                    z,
                    row_max[i],
                    row_sum[i],
                    targets[i, j],
                    self.layout.features[-1][j],
                    first=j == 0,
                    n_rows=n_rows,
                )
                continue
            output = z if linear else block_softmax(z, row_max[i], row_sum[i])
            value, grads[i, j] = squared_error(output, targets[i, j], scale)
            partial += value
            if not linear and with_grad:
                probs[i, j], dots[i, j] = output, (grads[i, j] * output).sum(axis=1)
        self.compute += time.perf_counter() - t0
        if probs:
            grads = self._softmax_mse_deltas(step, probs, grads, dots)
        return partial, grads, row_max

    def _softmax_mse_deltas(self, step: int, probs: dict, d_probs: dict, dots: dict) -> dict:
        """``d logits`` of MSE on softmax outputs, once the grid rows' sums of ``d probs * probs`` are in."""
        parts = self.share_row(step, "smd", dots)
        t0 = time.perf_counter()
        totals = {i: ordered_sum(pieces) for i, pieces in parts.items()}
        grads = {(i, j): softmax_mse_delta(p, d_probs[i, j], totals[i]) for (i, j), p in probs.items()}
        self.compute += time.perf_counter() - t0
        return grads

    def backward(self, step: int, pre, d_logits: dict):
        n = self.n_layers
        gW, gb = [None] * n, [None] * n
        dZ = d_logits
        for layer in range(n - 1, -1, -1):
            products = []
            if layer > 0:
                self.skew(step, f"ga{layer}", "L", dZ, transposed=False)
                products.append((f"ga{layer}", False, True))
            self.skew(step, f"gw{layer}", "R", dZ, transposed=False)
            products.append((f"gw{layer}", True, False))
            t0 = time.perf_counter()
            partial_db = {(j, i): block.sum(axis=0) for (i, j), block in dZ.items()}
            self.compute += time.perf_counter() - t0
            # the bias all-gather travels while the Cannon products run
            for (j, i), value in partial_db.items():
                for address in self.col_workers[j]:
                    self.channel.send(address, f"{step}|db{layer}|{j}|{i}", value)
            result = self.cannon(step, products)
            gW[layer] = result[f"gw{layer}"]
            parts = {j: [self.recv(f"{step}|db{layer}|{j}|{k}", (k, j)) for k in range(self.q)] for j in self.columns}
            t0 = time.perf_counter()
            gb[layer] = {j: ordered_sum(pieces) for j, pieces in parts.items()}
            if layer > 0:
                dA = result[f"ga{layer}"]
                dZ = {
                    cell: activation_backward(block, pre[layer - 1][cell], self.activation, self.slope)
                    for cell, block in dA.items()
                }
            self.compute += time.perf_counter() - t0
        return gW, gb

    def propose_update(self, gW, gb):
        """The cause of divergence on this worker's cells and the new weights and velocities (not yet
        committed; None when a gradient is not finite)."""
        t0 = time.perf_counter()
        cause, new = DivergenceCause.of(gradients=all_finite(*gW, *gb)), None
        if cause == DivergenceCause.FINITE:
            W, vW, b, vb = {}, {}, {}, {}
            for (layer, cell), w in self.W.items():
                W[layer, cell], vW[layer, cell] = self._updated(w, gW[layer][cell], self.vW[layer, cell])
            for (layer, j), bias in self.b.items():
                b[layer, j], vb[layer, j] = self._updated(bias, gb[layer][j], self.vb[layer, j])
            cause = DivergenceCause.of(weights=all_finite(W, b))
            new = (W, vW, b, vb)
        self.compute += time.perf_counter() - t0
        return cause, new

    def _updated(self, param, grad, velocity):
        # graph mode's SGD step on a block: the same arithmetic as serial's optimiser
        return sgd_step(param, grad, velocity, self.lr, self.momentum)

    # -- validation ------------------------------------------------------------
    def evaluate(self, done: int) -> tuple[float, int]:
        """This worker's share of the validation loss and of the correctly classified rows after ``done`` steps.

        A forward pass by Cannon over the validation rows (each grid row holds a band of them), with the
        weights held now; the loss part is a sum over the hosted cells, divided by the client.
        """
        tag = f"val{done}"
        compute = self.compute  # the step's compute time stays the training's own
        for layer in range(self.n_layers):
            self.skew(tag, f"f{layer}", "R", {cell: self.W[layer, cell] for cell in self.cells}, transposed=False)
        logits = self.forward(tag, self.Xv, grad=False)[-1]
        by_row = self.loss_name == "cross_entropy"  # labels of the grid row, else the cell's targets
        targets = {(i, j): self.yv[i] if by_row else self.yv[i, j] for i, j in logits}
        partial, _, row_max = self.output_loss(tag, logits, targets, with_grad=False)
        if not by_row:
            self.compute = compute
            return partial, 0
        first = {
            (i, j): _first_maximum(z, row_max[i], self.layout.features[-1][j][0], self.layout.sizes[-1])
            for (i, j), z in logits.items()
        }
        # a row's predicted class: the first column that holds its maximum, as numpy's argmax
        predicted = {i: np.min(np.stack(parts), axis=0) for i, parts in self.share_row(tag, "am", first).items()}
        correct = sum(int(np.sum(predicted[i] == self.yv[i])) for i, j in logits if j == 0)
        self.compute = compute
        return partial, correct

    def announce(self, step: int, partial: float, cause: DivergenceCause) -> None:
        """Send this worker's (loss part, cause of divergence) of ``step`` to every worker."""
        message = np.array([partial, float(cause)])
        for address in self.layout.workers:
            self.channel.send(address, f"{step}|sync|{self.worker_index}", message)

    def agree(self, step: int) -> tuple[float, DivergenceCause]:
        """Gather every worker's announcement of ``step``: the loss and the step's cause of divergence.

        The cause is the worst announced, or the loss's when the total is not finite. All workers
        read the same numbers in the same order, so all decide alike.
        """
        total, cause = 0.0, DivergenceCause.FINITE
        for k, address in enumerate(self.layout.workers):
            got = self.recv(f"{step}|sync|{k}", address)
            total += float(got[0])
            cause = max(cause, DivergenceCause(int(got[1])))
        loss = mean_loss(total, self.loss_name, self.layout.batch_size, self.layout.sizes[-1])
        return loss, max(cause, DivergenceCause.of(loss=math.isfinite(loss)))

    def state(self) -> tuple:
        return self.W, self.vW, self.b, self.vb

    def run(self) -> dict:
        """Train; a step's update is committed at once and confirmed one step later.

        The agreement on step ``t`` (loss, cause of divergence) rides on the
        first messages of step ``t + 1`` instead of a barrier of its own; if it
        says stop, every worker returns to the state before step ``t``.
        """
        losses, stats, snapshots = [], [], {}
        diverged = None
        pending = None  # (step, state before it, stats) of the unconfirmed step
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            for step in range(self.start, self.stop):
                t_step = time.perf_counter()
                self.compute = 0.0
                channel = self.channel
                before_step = channel.bytes_sent, channel.messages_sent, channel.waited, channel.transfer_waited
                if pending is not None:
                    self.announce(pending[0], *pending[3])
                self.start_step(step)
                A0, batch_rows = self.inputs(step)
                pre = self.forward(step, A0)
                targets = {cell: self.targets(cell, batch_rows) for cell in self.cells}
                partial, d_logits, _ = self.output_loss(step, pre[-1], targets)
                gW, gb = self.backward(step, pre, d_logits)
                cause, new = self.propose_update(gW, gb)
                if pending is not None:
                    stop = self.confirm(pending, losses, stats, snapshots)
                    if stop is not None:
                        diverged = stop
                        break
                self.channel.check_sends()
                before = self.state()
                if new is not None:
                    self.W, self.vW, self.b, self.vb = new
                wall = time.perf_counter() - t_step
                step_stats = (
                    self.compute,
                    wall,
                    channel.bytes_sent - before_step[0],
                    channel.messages_sent - before_step[1],
                    channel.waited - before_step[2],
                    channel.transfer_waited - before_step[3],
                )
                pending = (step, before, step_stats, (partial, cause))
            if diverged is None and pending is not None:
                self.announce(pending[0], *pending[3])
                diverged = self.confirm(pending, losses, stats, snapshots)
        return self.result(losses, stats, diverged, snapshots)

    def result(self, losses, stats, diverged, snapshots) -> dict:
        """What the task returns: the confirmed steps' figures, the blocks the cells hold and, after
        divergence, ``(1-based step, DivergenceCause)``."""
        return {
            "worker": self.me,
            "losses": losses,
            "stats": stats,
            "diverged": diverged,
            # every block the cells hold: the next stretch may start from it on this worker
            "state": {"W": self.W, "vW": self.vW, "b": self.b, "vb": self.vb},
            "snapshots": snapshots,
            "evaluations": self.evaluations,
        }

    def start_step(self, step: int) -> None:
        # weights are known now: skew them for the forward products and for dA = dZ @ W.T
        for layer in range(self.n_layers):
            blocks = {cell: self.W[layer, cell] for cell in self.cells}
            self.skew(step, f"f{layer}", "R", blocks, transposed=False)
            if layer > 0:
                self.skew(step, f"ga{layer}", "R", blocks, transposed=True)

    def confirm(self, pending, losses, stats, snapshots) -> tuple[int, DivergenceCause] | None:
        """Settle the unconfirmed step: record it, or roll back and return its 1-based number and cause."""
        step, before, step_stats, _ = pending
        loss, cause = self.agree(step)
        if cause != DivergenceCause.FINITE:
            self.W, self.vW, self.b, self.vb = before
            return step + 1, cause
        self.record(step, loss, step_stats, losses, stats, snapshots)
        return None

    def record(self, step, loss, step_stats, losses, stats, snapshots) -> None:
        """Keep a confirmed step's loss and figures; evaluate or snapshot the weights after it when asked."""
        losses.append(loss)
        stats.append(step_stats)
        if step + 1 in self.eval_steps and self.Xv is not None:
            self.evaluations[step + 1] = self.evaluate(step + 1)
        elif step + 1 in self.eval_steps:
            snapshots[step + 1] = self.layout.reported_by(self.me, {"W": self.W, "b": self.b})


class SingleCellProgram(CellProgram):
    """A 1 x 1 grid: the whole network in one cell, stepped by the numeric core as :class:`SerialTrainer` does.

    With one cell there is nothing to exchange and nobody to agree with, so a
    step is one call of :meth:`MLP.loss_and_gradients` and the optimiser's
    update, without the per-block messages and bookkeeping of the general
    program (on a small net those cost more than the arithmetic). A step
    whose loss, gradients or new weights are not finite is not committed,
    and its cause is named as in the general program.
    Validation passes use the general program's products, sent to itself.
    """

    CELL = (0, 0)

    def __init__(self, run: ResidentRun, payload: dict, channel: Channel):
        super().__init__(run, payload, channel)
        s = run.settings
        self.net = MLP.from_arrays(
            self._weights(),
            self._biases(),
            activation=s["activation"],
            output=s["output"],
            negative_slope=self.slope,
        )

    def _weights(self) -> list:
        return [self.W[layer, self.CELL] for layer in range(self.n_layers)]

    def _biases(self) -> list:
        return [self.b[layer, 0] for layer in range(self.n_layers)]

    def local_step(self, step: int):
        """Loss of ``step``, its cause of divergence and the new ``(W, vW, b, vb)`` (None when a loss or
        gradient is not finite)."""
        rows = self.order.indices(step)
        net = self.net
        net.weights, net.biases = self._weights(), self._biases()
        value, grad_w, grad_b = net.loss_and_gradients(
            self.X[0][rows], self.targets(self.CELL, {0: rows}), self.loss_name
        )
        if not math.isfinite(value):
            return value, DivergenceCause.of(loss=False), None
        # the general program's update and finiteness checks, on the one cell's blocks
        cause, new = self.propose_update([{self.CELL: g} for g in grad_w], [{0: g} for g in grad_b])
        return value, cause, new

    def run(self) -> dict:
        losses, stats, snapshots = [], [], {}
        diverged = None
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            for step in range(self.start, self.stop):
                t_step = time.perf_counter()
                loss, cause, new = self.local_step(step)
                if cause != DivergenceCause.FINITE:
                    diverged = step + 1, cause
                    break
                self.W, self.vW, self.b, self.vb = new
                wall = time.perf_counter() - t_step
                self.record(step, loss, (wall, wall, 0, 0, 0.0, 0.0), losses, stats, snapshots)
        return self.result(losses, stats, diverged, snapshots)


def _first_maximum(z: np.ndarray, row_max: np.ndarray, c0: int, n_out: int) -> np.ndarray:
    """Per row, the first column (numbered in the whole row) of block ``z`` that holds the row's maximum;
    ``n_out`` where none does."""
    if z.shape[1] == 0:
        return np.full(z.shape[0], n_out, dtype=np.int64)
    hit = z == row_max[:, None]
    return np.where(hit.any(axis=1), c0 + hit.argmax(axis=1), n_out).astype(np.int64)


# -- tasks on a finished run's results (which stay in their worker's memory) ---------------------
def summary(result: dict) -> dict:
    """A worker's result without its blocks: what the client reads after a run."""
    return {k: v for k, v in result.items() if k != "state"}


def owned_blocks(result: dict, layout: Layout) -> dict:
    """The blocks of ``result`` that only this worker reports (:meth:`Layout.reported_by`)."""
    return layout.reported_by(result["worker"], result["state"])


def save_blocks(result: dict, layout: Layout, tmp: str) -> list:
    """Write this worker's blocks into the open checkpoint store ``tmp``: ``[(array, "i.j", sha256), ...]``."""
    return [
        (array, index, write_block(tmp, array, region, block))
        for array, index, region, block in layout.named_blocks(owned_blocks(result, layout))
    ]


def block_of(result: dict, name: str, key) -> np.ndarray:
    """One block of a worker's result (``name`` in ``W``, ``b``, ``vW``, ``vb``)."""
    return result["state"][name][key]
