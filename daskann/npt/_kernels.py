"""The per-cell numeric core of network-parallel training: block kernels run on the workers.

Pure numpy on blocks, no dask. Both modes use it: graph mode calls these
functions as tasks (or epilogues of a block product), resident mode inside its
cell loop, so a cell's bias add, loss, bias gradient and SGD step are written
once. The arithmetic repeats that of :mod:`daskann.nn` element by element (same
operations in the same order), so that training on a grid differs from
:class:`daskann.SerialTrainer` only in the order in which the partial sums of
each matrix product are added.

Kernels never modify their inputs: a block may be read by several tasks, and a
task may run again after a worker is lost. Those that make blocks run with the
worker's heap kept (:func:`daskann._heap.keeps_heap`), so a step's blocks reuse
the memory of the step before instead of fresh mappings.

An *operand spec* is a tuple ``(value, field, window, transform)``: ``value``
is a stored block (an array, or a dict holding one under ``field``);
``window = (r0, r1, c0, c1)`` selects part of it; ``transform`` is ``None`` or
``(activation, negative_slope)`` to apply a hidden-layer activation on the
fly (activations ``A = act(Z)`` are never stored, only ``Z``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daskann._heap import keeps_heap
from daskann.nn._functional import activate, activation_backward, softmax


def operand(spec):
    """The array an operand spec points at."""
    value, field, window, transform = spec
    if field is not None:
        value = value[field]
    if not value.flags.aligned:
        # a small block received from another worker may sit at any byte offset (daskann._wire); numpy
        # would copy it in a product's operand order, turning a transposed BLAS call into another whose
        # rounding differs, so the sum would depend on how the message was laid out. A copy in the
        # block's own layout makes the product the one its owner computes.
        value = value.copy(order="K")
    if window is not None:
        r0, r1, c0, c1 = window
        value = value[r0:r1, c0:c1]
    if transform is not None:
        value = activate(value, transform[0], transform[1])
    return value


@keeps_heap
def block_product(acc, terms, shape, dtype, partner=None, epilogue=None, extras=()):
    """``acc + sum(op(a) @ op(b))`` over ``terms``, then ``+ partner``, then the epilogue.

    Parameters
    ----------
    acc : ndarray or None
        Running sum of this output block (not modified).
    terms : list of (a_spec, trans_a, b_spec, trans_b, out_window)
        Block products to add; ``out_window`` is ``None`` for the whole block.
    shape, dtype
        Of the output block.
    partner : ndarray or None
        The other accumulation chain of the same block, added last.
    epilogue : callable or None
        ``epilogue(out, fresh, extras)`` finishes the sum ``out`` (``fresh``:
        an array of the task's own, which it may overwrite):
        :func:`add_bias`, :class:`BiasMSE`, :class:`ActivationBackward`,
        :class:`Velocity` or :class:`SGDStep`.
    extras : tuple of operand specs
    """
    out, fresh = _accumulate(acc, terms, shape, dtype)
    if partner is not None:
        out, fresh = out + partner, True
    if epilogue is None:
        return out if fresh else out.copy()
    return epilogue(out, fresh, extras)


def _accumulate(acc, terms, shape, dtype):
    """``(acc + sum(op(a) @ op(b)), fresh)``: the sum, and whether it is a new array (``acc`` is never modified)."""
    out, fresh = acc, False
    untouched = set()  # windows of a fresh zero block no term has written yet
    for a_spec, trans_a, b_spec, trans_b, window in terms:
        a = operand(a_spec)
        b = operand(b_spec)
        a, b = (a.T if trans_a else a), (b.T if trans_b else b)
        if window is not None and (out is None or window in untouched):
            if out is None:
                out, fresh = np.zeros(shape, dtype=dtype), True
                untouched = _disjoint_windows(terms)
            # the product lands in its window directly: no temporary, no pass adding it to zeros
            r0, r1, c0, c1 = window
            np.matmul(a, b, out=out[r0:r1, c0:c1])
            untouched.discard(window)
            continue
        prod = a @ b
        if window is None:
            if out is None:
                out, fresh = prod, True
            else:
                prod += out  # addition commutes exactly, so this is out + prod
                out, fresh = prod, True
        else:
            if out is None:
                out, fresh = np.zeros(shape, dtype=dtype), True
            elif not fresh:
                out, fresh = out.copy(), True
            r0, r1, c0, c1 = window
            out[r0:r1, c0:c1] += prod
            untouched.discard(window)
    if out is None:
        out, fresh = np.zeros(shape, dtype=dtype), True
    return out, fresh


def _disjoint_windows(terms) -> set:
    """Output windows of ``terms`` that overlap no other term's window (each is written exactly once)."""
    windows = [t[4] for t in terms]
    if any(w is None for w in windows):
        return set()
    out = set()
    for k, (r0, r1, c0, c1) in enumerate(windows):
        if all(k == m or r1 <= q0 or q1 <= r0 or c1 <= d0 or d1 <= c0 for m, (q0, q1, d0, d1) in enumerate(windows)):
            out.add(windows[k])
    return out


# -- block arithmetic of the forward and backward passes, beside the products -----------------
def plus_bias(out, bias, *, fresh: bool):
    """``out + bias`` for a block of pre-activations, in place when ``out`` is the caller's own (``fresh``)."""
    if fresh:
        out += bias
        return out
    return out + bias


def ordered_sum(parts: list):
    """``parts[0] + parts[1] + ...`` added left to right into a new array.

    The bias gradient (and softmax row sums) of a grid column or row: every
    worker adds the same parts in the same order, so all get the same bits.
    """
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


# -- the SGD step on a cell's blocks: graph mode's tasks and resident mode's cell loop -------
def new_velocity(grad, velocity, momentum, *, grad_is_fresh=False):
    """``momentum * velocity + grad`` as :meth:`daskann.nn.SGD.update` computes it (``grad`` when no momentum).

    ``grad`` is returned itself (no momentum) only when ``grad_is_fresh``: an array of the caller's own.
    """
    if not momentum:
        return grad if grad_is_fresh else grad.copy()
    out = velocity * grad.dtype.type(momentum)
    out += grad
    return out


def stepped(param, velocity, lr):
    """``param - lr * velocity`` as :meth:`daskann.nn.SGD.update` computes it (one new array, not two)."""
    out = velocity * param.dtype.type(lr)
    return np.subtract(param, out, out=out)


def sgd_step(param, grad, velocity, lr, momentum, *, grad_is_fresh=False):
    """The new ``(param, velocity)`` of one weight or bias block; the inputs stay as they were."""
    velocity = new_velocity(grad, velocity, momentum, grad_is_fresh=grad_is_fresh)
    return stepped(param, velocity, lr), velocity


@keeps_heap
def weight_update(weight, velocity, lr):
    """Task of graph mode's unpacked blocks: :func:`stepped` on the block's cell."""
    return stepped(weight, velocity, lr)


# -- epilogues of block_product: what the last task of an output block does with its sum ------
def add_bias(out, fresh: bool, extras):
    """``out + b`` with the bias block ``b`` at ``extras[0]`` (in place when ``out`` is fresh)."""
    return plus_bias(out, operand(extras[0]), fresh=fresh)


@dataclass(frozen=True)
class BiasMSE:
    """The output layer with MSE on a linear output: the bias added, then ``{"loss", "g"}`` right here.

    The loss partial sum and gradient are against rows ``rows`` of the target band
    ``extras[1]`` (a copy of the output columns' targets lives on every worker of
    the grid column); ``scale`` is ``2 / (batch * n_outputs)`` of the whole
    batch, as in :func:`daskann.nn._functional.mse_loss`.
    """

    scale: float
    rows: np.ndarray
    with_grad: bool

    def __call__(self, out, fresh: bool, extras):
        return _mse(add_bias(out, fresh, extras), extras[1][self.rows], self.scale, self.with_grad)


@dataclass(frozen=True)
class ActivationBackward:
    """The gradient through the activation at the pre-activations ``extras[0]``."""

    activation: str
    negative_slope: float

    def __call__(self, out, fresh: bool, extras):
        return activation_backward(out, operand(extras[0]), self.activation, self.negative_slope)


@dataclass(frozen=True)
class Velocity:
    """SGD's new velocity ``momentum * v + g`` from the velocity block ``extras[0]``."""

    momentum: float

    def __call__(self, out, fresh: bool, extras):
        return new_velocity(out, operand(extras[0]), self.momentum, grad_is_fresh=fresh)


@dataclass(frozen=True)
class SGDStep:
    """The whole SGD update of a weight block: ``{"w": w - lr * v, "v": v}``.

    ``v`` as :class:`Velocity` from the velocity ``extras[0]``; the weights are ``extras[1]``.
    """

    lr: float
    momentum: float

    def __call__(self, out, fresh: bool, extras):
        w, v = sgd_step(operand(extras[1]), out, operand(extras[0]), self.lr, self.momentum, grad_is_fresh=fresh)
        return {"w": w, "v": v}


@keeps_heap
def bias_update(state, grad_specs, lr, momentum, collect_loss):
    """New ``{"b", "v"}`` of a bias block from the column of ``dZ`` blocks below it.

    ``db`` is the sum over the batch (rows of the grid) of ``dZ``. With
    ``collect_loss`` the loss partial sums carried by the ``dZ`` blocks are
    added up and returned under ``"loss"``, so that the client can read the
    step's loss from these small dicts alone.
    """
    grad = ordered_sum([operand(spec).sum(axis=0) for spec in grad_specs])
    loss = 0.0
    if collect_loss:
        for spec in grad_specs:
            loss += spec[0]["loss"]
    b, v = sgd_step(state["b"], grad, state["v"], lr, momentum, grad_is_fresh=True)
    result = {"b": b, "v": v}
    if collect_loss:
        result["loss"] = float(loss)
    return result


@keeps_heap
def take_rows(band, rows):
    """Rows ``rows`` of a stored column band of the training data."""
    return band[rows]


def _mse(output, target, scale, with_grad):
    """Loss partial sum and gradient of one output block (MSE on a linear output), for graph mode's output tasks.

    ``output`` is a new array of the calling task, not kept: the difference and
    the gradient are taken in its memory, and the sum of squares in one pass.
    """
    diff = np.subtract(output, target, out=output)
    loss = float(np.vdot(diff, diff))
    if not with_grad:
        return {"loss": loss}
    diff *= diff.dtype.type(scale)  # as diff * scale
    return {"g": diff, "loss": loss}


@keeps_heap
def loss_panel(z_specs, target, *, loss, n_batch, size, with_grad=True):
    """Loss partial sum and ``d loss / d Z`` of a whole row panel of the output.

    The softmax needs whole rows of the output layer, so the blocks of one
    grid row are put side by side first. ``target`` is ``(all targets or
    labels on this worker, rows of the panel)``. ``n_batch`` and ``size`` are
    the batch size and ``batch * n_outputs`` of the whole batch. Without
    ``with_grad`` (validation) the count of correct labels comes instead.
    """
    logits = np.concatenate([operand(s) for s in z_specs], axis=1) if len(z_specs) > 1 else operand(z_specs[0])
    if loss == "cross_entropy":
        labels = target[0][target[1]]
        n = logits.shape[0]
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(shifted).sum(axis=1))
        rows = np.arange(n)
        value = float(np.sum(log_norm - shifted[rows, labels]))
        if not with_grad:
            return {"loss": value, "correct": int(np.sum(np.argmax(logits, axis=1) == labels))}
        return {"g": cross_entropy_delta(shifted, log_norm, rows, labels, n_batch), "loss": value}
    # MSE on the softmax output
    probs = softmax(logits)
    value, d_probs = squared_error(probs, target[0][target[1]], 2.0 / size if with_grad else None)
    if not with_grad:
        return {"loss": value}
    return {"g": softmax_mse_delta(probs, d_probs, (d_probs * probs).sum(axis=1)), "loss": value}


# -- the loss on a cell's output blocks: graph mode's loss tasks and resident mode's cell loop ----
def mean_loss(total: float, loss: str, n_rows: int, n_outputs: int) -> float:
    """The mean loss from the sum of the blocks' partial sums over ``n_rows`` rows (and outputs, for MSE)."""
    return total / (n_rows if loss == "cross_entropy" else n_rows * n_outputs)


def validation_scores(total: float, correct: int, loss: str, n_samples: int, n_outputs: int) -> dict:
    """``val_loss`` (and ``val_accuracy``) of a validation set from the summed partial loss and correct rows."""
    scores = {"val_loss": mean_loss(total, loss, n_samples, n_outputs)}
    if loss == "cross_entropy":
        scores["val_accuracy"] = correct / n_samples
    return scores


def squared_error(output, target, scale=None):
    """``(sum((output - target) ** 2), (output - target) * scale)`` on a block; no gradient without ``scale``.

    MSE's partial sum and ``d loss / d output``, with ``scale`` the
    ``2 / (batch * n_outputs)`` of the whole batch, as in
    :func:`daskann.nn._functional.mse_loss`.
    """
    diff = output - target
    value = float(np.sum(diff * diff))
    return value, (None if scale is None else diff * diff.dtype.type(scale))


def block_softmax(z, row_max, row_sum):
    """The softmax of a block of logits, from its whole rows' maximum and ``sum(exp(z - max))``."""
    return np.exp(z - row_max[:, None]) / row_sum[:, None]


def softmax_mse_delta(probs, d_probs, row_dot):
    """``d loss / d Z`` of MSE on softmax outputs; ``row_dot`` is the whole rows' sum of ``d_probs * probs``."""
    return probs * (d_probs - row_dot[:, None])


def cross_entropy_delta(shifted, log_norm, hit_rows, hit_cols, n_rows):
    """``d loss / d Z`` of softmax cross-entropy: ``softmax - onehot``, over the batch's ``n_rows``.

    ``shifted`` is the block less its rows' maxima, ``log_norm`` the rows'
    log-normaliser; the labels fall at ``(hit_rows, hit_cols)`` of the block.
    """
    delta = np.exp(shifted - log_norm[:, None])
    delta[hit_rows, hit_cols] -= 1
    delta *= delta.dtype.type(1.0 / n_rows)
    return delta


def cross_entropy_block(total, z, row_max, row_sum, labels, columns, *, first: bool, n_rows=None):
    """``total`` plus one output block's part of the cross-entropy, and its ``d loss / d Z`` (with ``n_rows``).

    The block holds output columns ``columns = (c0, c1)`` of whole rows whose
    maxima and ``sum(exp(z - max))`` are ``row_max`` and ``row_sum``; the
    ``first`` block of a row counts its rows' log-normaliser, the others only
    the labels that fall in them (a block may have no columns). The part is added to the running ``total``
    term by term, so the sum over blocks does not depend on how it is cut.
    """
    c0, c1 = columns
    log_norm = np.log(row_sum)
    shifted = z - row_max[:, None]
    inside = (labels >= c0) & (labels < c1)
    hit_rows, hit_cols = np.nonzero(inside)[0], labels[inside] - c0
    if first:  # each row's log-normaliser counted once
        total += float(np.sum(log_norm))
    total -= float(np.sum(shifted[hit_rows, hit_cols]))
    if n_rows is None:
        return total, None
    return total, cross_entropy_delta(shifted, log_norm, hit_rows, hit_cols, n_rows)


def all_finite(*values):
    """True when every array (or operand spec, or array in a dict) is finite."""
    for value in values:
        if isinstance(value, tuple):
            value = operand(value)
        arrays = value.values() if isinstance(value, dict) else [value]
        for a in arrays:
            if isinstance(a, np.ndarray) and not np.isfinite(a).all():
                return False
    return True


@keeps_heap
def view(spec):
    """Materialise an operand spec (for gathering or converting to dask)."""
    return np.array(operand(spec), copy=True)
