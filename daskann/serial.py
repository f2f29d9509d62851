"""The reference trainer: plain minibatch SGD in one process."""

from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np
from threadpoolctl import threadpool_limits

from daskann import store
from daskann._base import BaseTrainer, TrainingDiverged
from daskann._heap import heap_for_blocks
from daskann._history import HistoryRecorder
from daskann._options import SGDOptions
from daskann._validation import Activation, Loss, check_int, invalid
from daskann.data._batches import check_batch_order
from daskann.exceptions import DivergenceCause
from daskann.nn import ACTIVATIONS, LOSSES, MLP, OUTPUTS, SGD


class SerialTrainer(BaseTrainer):
    """Minibatch SGD with momentum in one process, numpy only.

    The reference every parallel trainer is tested against. Takes the settings
    of :class:`daskann._base.BaseTrainer`, with every choice of the numeric core
    and the batch orders of Schroder (2017):

    Parameters
    ----------
    activation : {"relu", "leaky_relu", "sigmoid", "tanh"}
        Hidden-layer activation.
    loss : {"mse", "cross_entropy", "sse"}
        ``"sse"`` is ``0.5 * sum((out - y)**2)`` over rows and outputs, the
        loss of classic backpropagation (delta ``(out - y) * f'(out)``).
    batch_size : int or None
        Rows per step; ``None`` trains on the full batch (all rows every step,
        in order).
    network : dict or NetworkOptions, optional
        As the other trainers', where ``output`` may also be ``"sigmoid"`` or
        ``"tanh"`` (part of the ``"mse"`` and ``"sse"`` losses).
    sgd : dict or SGDOptions, optional
        As the other trainers', where ``shuffle`` may also be
        ``"serialized"``: step ``i`` trains on the single row
        ``i mod n_samples`` (needs ``batch_size=None``). See
        :class:`daskann.data.BatchOrder`.
    bias : bool
        Whether the dense layers have biases.
    blas_threads : int or None
        BLAS threads while training; ``None`` leaves the library's setting.

    Attributes
    ----------
    model_ : MLP
        The trained network.
    velocity_ : list of ndarray
        SGD velocity per parameter (``model_.params`` order).
    history_ : xarray.Dataset
        Over ``step`` (updates completed): ``loss`` of the step's minibatch
        (before its update), ``time`` since training started, and
        ``val_loss`` / ``val_accuracy`` at evaluation steps.
    n_steps_ : int
        Training steps completed.
    batch_order_ : daskann.data.BatchOrder

    Examples
    --------
    >>> from daskann.data import make_linear
    >>> X, y = make_linear(256, 8, 2, seed=0)
    >>> trainer = SerialTrainer((16,), lr=0.05, batch_size=32).fit(X, y, steps=20)
    >>> trainer.history_.sizes["step"]
    20
    """

    method = "serial"
    _activations, _outputs, _losses = ACTIVATIONS, OUTPUTS, LOSSES

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
        bias=True,
        blas_threads=1,
    ):
        self._store_params(locals())

    def _check_settings(self, eval_every=None) -> dict:
        settings = super()._check_settings(eval_every)
        if not isinstance(self.bias, (bool, np.bool_)):
            raise invalid("bias", self.bias, "True or False", TypeError)
        settings["bias"] = bool(self.bias)
        return settings

    def _check_batch_order(self, shuffle) -> dict:
        batch_size, shuffle = check_batch_order(self.batch_size, shuffle, SGDOptions.name_of("shuffle"))
        return {"batch_size": batch_size, "shuffle": shuffle}

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
        """Train from the initialisation (or ``init_model``, or a checkpoint).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like
            Targets for ``"mse"`` (any real numbers), class labels for
            ``"cross_entropy"`` (any hashable values, kept in ``classes_``).
        steps, epochs : int, optional
            Total training length for this call, at most one of the two; by
            default the trainer's ``steps`` or ``epochs``. With ``resume``
            this counts the steps already done.
        validation_data : (X_val, y_val), optional
        eval_every : int, optional
            Validation every this many steps (and at the end), as Keras's
            ``validation_freq``; by default once per epoch.
        init_model : MLP, optional
            Start from these weights instead of a seeded initialisation.
        resume : path, optional
            A checkpoint store or a run folder to continue from.

        Returns
        -------
        self
        """
        settings = self._check_settings(eval_every)
        if self.blas_threads is not None:
            check_int("blas_threads", self.blas_threads)
        data = self._check_data(X, y, validation_data, settings, model=init_model)
        order = self._batch_order(settings, data.n_samples)
        total = self._check_length(steps, epochs, order.steps_per_epoch)
        self._keep_inputs(settings, data, order)
        history = HistoryRecorder("step")
        if resume is not None:
            ckpt = self._load_resume(resume, settings, data, order)
            model, velocity, done = ckpt.model, ckpt.velocity, ckpt.step
            history.extend_from(store.run_history(resume, done))
        else:
            model = self._initial_model(settings, data.n_features, data.n_outputs, init_model)
            velocity, done = SGD.init_state(model.params), 0
        self._run(model, velocity, done, total, history)
        return self

    def partial_fit(self, X=None, y=None, classes=None, *, steps=None, epochs=None):
        """Continue training: one more epoch over ``X`` (or ``steps`` / ``epochs``), as ``MLPClassifier``.

        Parameters
        ----------
        X, y : array-like, optional
            The data to train on; ``None`` continues on the data of the last call.
            The first call fits on them from the initialisation.
        classes : array-like, optional
            Every class label of all calls (classifiers); the first call takes
            them from ``y`` when not given, later calls must match ``classes_``.
        steps, epochs : int, optional
            How long to train in this call, at most one of the two; by default
            one epoch over the data.

        Returns
        -------
        self
        """
        return self._partial_fit(X, y, classes, steps, epochs)

    def _continue_fit(self, X, y, steps, epochs) -> None:
        self._continue_on(X, y, self.model_)
        total = self._partial_length(steps, epochs)
        self._run(self.model_, self.velocity_, self.n_steps_, self.n_steps_ + total, self._continued_history())

    def _run(self, model: MLP, velocity, start: int, stop: int, history: HistoryRecorder) -> None:
        settings = self._settings
        self._check_checkpoint_space(settings, model.sizes, start, stop)
        try:
            # overflow is caught below and reported as divergence, not as numpy warnings
            limits = threadpool_limits(self.blas_threads, user_api="blas") if self.blas_threads else nullcontext()
            bar = self._progress_bar(stop, "serial", initial=start)
            # in a dask worker (a partition sub-model, dask-ml's Incremental, a search) the step's arrays come
            # from the kept heap, not from fresh mappings: 1.5 times faster on the partition paper's nets
            with self._run_lock(), limits, heap_for_blocks(), np.errstate(over="ignore", invalid="ignore"), bar:
                self._steps(model, velocity, start, stop, history, bar)
        finally:
            # also on divergence: keep the last finite state and the history so far
            self._keep_results(
                model, velocity, history.last_coord(default=start), history.to_dataset(self._history_attrs(settings))
            )

    def _steps(self, model: MLP, velocity, start: int, stop: int, history: HistoryRecorder, bar) -> None:
        settings, data, order = self._settings, self._data, self.batch_order_
        optimizer = SGD(settings["lr"], settings["momentum"])
        params = model.params
        # the state a step starts from stays untouched until the new one is known to be finite
        spare = [np.empty_like(a) for a in params], [np.empty_like(v) for v in velocity]
        eval_every = settings["eval_every"] or order.steps_per_epoch
        ckpt_every = settings["checkpoint_every"]
        checkpointed = self._checkpoint_dir is not None  # resolved once: the loop is the hot path
        t0 = time.perf_counter() - history.last_value("time", default=0.0)
        for step in range(start, stop):
            rows = order.indices(step)
            value, grad_w, grad_b = model.loss_and_gradients(data.X[rows], data.y[rows], settings["loss"])
            if not np.isfinite(value):
                raise TrainingDiverged(step + 1, DivergenceCause.of(loss=False).what)
            grads = model.interleave(grad_w, grad_b)
            new_params, new_velocity = spare
            for p, g, v, p_new, v_new in zip(params, grads, velocity, new_params, new_velocity, strict=True):
                optimizer.update_into(p, g, v, p_new, v_new)
            # a gradient that is not finite makes the weights it updates not finite (lr > 0): the gradients
            # are looked at only then, to say which it was
            if not _all_finite(new_params):
                cause = DivergenceCause.of(gradients=_all_finite(grads), weights=False)
                raise TrainingDiverged(step + 1, cause.what)
            spare = params, list(velocity)
            model.assign_params(new_params)
            velocity[:] = new_velocity
            params = new_params
            done = step + 1
            row = {"loss": value, "time": time.perf_counter() - t0}
            if done % eval_every == 0 or done == stop:
                row.update(self._evaluate(model, data.validation, settings["loss"]))
            history.append(done, **row)
            bar.update(done, loss=value)
            if checkpointed and (done == stop or (ckpt_every and done % ckpt_every == 0)):
                self._save_checkpoint(
                    model, velocity, done, order, settings, history=history.to_dataset(self._history_attrs(settings))
                )


def _all_finite(arrays) -> bool:
    return all(np.isfinite(a).all() for a in arrays)
