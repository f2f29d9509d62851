"""What every trainer shares: settings, input checks, model set-up, history, checkpoints."""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path

import numpy as np

from daskann import store
from daskann._validation import (
    check_choice,
    check_features,
    check_float,
    check_float_dtype,
    check_hidden_sizes,
    check_int,
    check_learning_rate,
    check_momentum,
    check_targets,
    invalid,
)
from daskann.data import BatchOrder
from daskann.nn import ACTIVATIONS, LOSSES, MLP, OUTPUTS, SGD


#: bytes of metadata per checkpoint store, and for the history stored beside them (estimates)
CHECKPOINT_OVERHEAD = 64 * 1024
HISTORY_ALLOWANCE = 4 * 2**20


class TrainingDiverged(RuntimeError):
    """Loss, gradients or weights became NaN or Inf.

    The trainer keeps the last finite state in ``model_``; :attr:`step` is the
    step at which training stopped.
    """

    def __init__(self, step: int, what: str):
        self.step = int(step)
        super().__init__(
            f"training diverged at step {self.step}: {what} became NaN or Inf; "
            f"the model keeps the last finite state (after {self.step - 1} steps). "
            "Lower the learning rate or the momentum."
        )


class TrainingData:
    """Validated training arrays and the network shape they imply."""

    def __init__(self, X, y, n_outputs, validation=None):
        self.X, self.y, self.n_outputs, self.validation = X, y, n_outputs, validation

    @property
    def n_samples(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]


class BaseTrainer:
    """Settings and bookkeeping shared by all trainers (scikit-learn style).

    Parameters
    ----------
    hidden_sizes : sequence of int
        Widths of the hidden layers; input and output widths come from the data.
    activation : {"relu", "leaky_relu"}
    output : {"linear", "softmax"}
    loss : {"mse", "cross_entropy"}
    lr : float
        Learning rate.
    momentum : float
        SGD momentum in ``[0, 1)``.
    batch_size : int
    shuffle : bool
        Shuffle each epoch (seeded) or walk the rows in order.
    seed : int
        Seed of the initialisation and the batch order.
    dtype : {"float64", "float32"}
    negative_slope : float
        Leaky ReLU slope.
    eval_every : int or None
        Validation every this many steps (and at the end); ``None`` means once
        per epoch.
    checkpoint_dir : path or None
        Run folder for checkpoints; ``None`` keeps everything in memory.
    checkpoint_every : int or None
        Checkpoint every this many steps (and at the end) when
        ``checkpoint_dir`` is set.
    verbose : int
        0 is silent; 1 shows a progress bar on stderr.
    """

    method = "base"

    def __init__(
        self,
        hidden_sizes=(64,),
        *,
        activation="relu",
        output="linear",
        loss="mse",
        lr=0.01,
        momentum=0.0,
        batch_size=32,
        shuffle=True,
        seed=0,
        dtype="float64",
        negative_slope=0.01,
        eval_every=None,
        checkpoint_dir=None,
        checkpoint_every=None,
        verbose=0,
    ):
        self.hidden_sizes = hidden_sizes
        self.activation = activation
        self.output = output
        self.loss = loss
        self.lr = lr
        self.momentum = momentum
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.dtype = dtype
        self.negative_slope = negative_slope
        self.eval_every = eval_every
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.verbose = verbose

    # -- scikit-learn parameter protocol ----------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        names = []
        for klass in cls.__mro__:
            if "__init__" in vars(klass):
                sig = inspect.signature(klass.__init__)
                names += [p for p in sig.parameters if p != "self" and p not in names]
                if klass is BaseTrainer:
                    break
        return names

    def get_params(self, deep: bool = True) -> dict:
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params):
        valid = self._param_names()
        for name, value in params.items():
            if name not in valid:
                raise invalid("parameter name", name, "one of " + ", ".join(valid))
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = {}
        for klass in type(self).__mro__:
            if "__init__" in vars(klass):
                for p in inspect.signature(klass.__init__).parameters.values():
                    defaults.setdefault(p.name, p.default)
        changed = [
            f"{k}={v!r}" for k, v in self.get_params().items() if not _same(defaults.get(k, inspect.Parameter.empty), v)
        ]
        return f"{type(self).__name__}({', '.join(changed)})"

    # -- checks ---------------------------------------------------------------
    def _check_settings(self) -> dict:
        """Validated copy of the settings; raises before anything runs."""
        s = {
            "hidden_sizes": check_hidden_sizes(self.hidden_sizes),
            "activation": check_choice("activation", self.activation, ACTIVATIONS),
            "output": check_choice("output", self.output, OUTPUTS),
            "loss": check_choice("loss", self.loss, LOSSES),
            "lr": check_learning_rate(self.lr),
            "momentum": check_momentum(self.momentum),
            "batch_size": check_int("batch_size", self.batch_size),
            "shuffle": bool(self.shuffle),
            "seed": check_int("seed", self.seed, minimum=0),
            "dtype": check_float_dtype(self.dtype),
            "negative_slope": check_float("negative_slope", self.negative_slope, minimum=0.0),
            "eval_every": None if self.eval_every is None else check_int("eval_every", self.eval_every),
            "checkpoint_every": None
            if self.checkpoint_every is None
            else check_int("checkpoint_every", self.checkpoint_every),
        }
        if self.checkpoint_dir is not None:
            if not isinstance(self.checkpoint_dir, (str, Path)):
                raise invalid("checkpoint_dir", self.checkpoint_dir, "a folder path or None", TypeError)
            store.check_writable_folder(self.checkpoint_dir)
            # another run writing this folder: refuse now, before any task or file is written
            store.RunLock(self.checkpoint_dir).check_free("checkpoint_dir")
        return s

    def _run_lock(self):
        """Exclusive claim on ``checkpoint_dir`` for the length of a fit (a no-op without one)."""
        if self.checkpoint_dir is None:
            return contextlib.nullcontext()
        return store.RunLock(self.checkpoint_dir)

    def _check_data(self, X, y, validation_data, settings, model: MLP | None = None) -> TrainingData:
        dtype = settings["dtype"]
        if model is not None and not isinstance(model, MLP):
            raise invalid("init_model", type(model).__name__, "an MLP or None", TypeError)
        n_in = model.sizes[0] if model is not None else None
        n_out = model.sizes[-1] if model is not None else None
        X = check_features(X, name="X", dtype=dtype, n_features=n_in)
        y, n_outputs = check_targets(y, loss=settings["loss"], n_samples=X.shape[0], dtype=dtype, n_outputs=n_out)
        if settings["batch_size"] > X.shape[0]:
            raise invalid("batch_size", settings["batch_size"], f"at most the number of samples ({X.shape[0]})")
        validation = None
        if validation_data is not None:
            if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
                raise invalid("validation_data", type(validation_data).__name__, "a pair (X_val, y_val)", TypeError)
            Xv = check_features(validation_data[0], name="validation_data[0]", dtype=dtype, n_features=X.shape[1])
            yv, _ = check_targets(
                validation_data[1], loss=settings["loss"], n_samples=Xv.shape[0], name="validation_data[1]",
                dtype=dtype, n_outputs=n_outputs,
            )
            validation = (Xv, yv)
        return TrainingData(X, y, n_outputs, validation)

    def _check_checkpoint_space(self, settings, sizes, start: int, stop: int, *, count: int | None = None,
                                extra_steps: int = 0) -> None:
        """Refuse, before any work, a run whose checkpoints cannot fit in ``checkpoint_dir``.

        ``count`` checkpoints (by default those that ``checkpoint_every``
        makes between ``start`` and ``stop``, plus those of ``extra_steps``
        more) of the parameters and velocity of a network of ``sizes``.
        """
        if self.checkpoint_dir is None:
            return
        if count is None:
            every = settings["checkpoint_every"]
            count = 0
            for first, last in ((start, stop), (0, extra_steps)):
                if last > first:
                    count += 1 if not every else last // every - first // every + (last % every != 0)
        n_params = sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        per_checkpoint = 2 * n_params * settings["dtype"].itemsize + CHECKPOINT_OVERHEAD
        store.check_free_space(self.checkpoint_dir, count * per_checkpoint + HISTORY_ALLOWANCE)

    @staticmethod
    def _check_length(steps, epochs, steps_per_epoch: int) -> int:
        if (steps is None) == (epochs is None):
            raise invalid("steps/epochs", (steps, epochs), "exactly one of steps or epochs")
        if steps is not None:
            return check_int("steps", steps)
        return check_int("epochs", epochs) * steps_per_epoch

    # -- set-up -----------------------------------------------------------------
    def _initial_model(self, settings, n_features, n_outputs, init_model: MLP | None) -> MLP:
        if init_model is not None:
            if not isinstance(init_model, MLP):
                raise invalid("init_model", type(init_model).__name__, "an MLP", TypeError)
            expected = (n_features, *settings["hidden_sizes"], n_outputs)
            if tuple(init_model.sizes) != expected:
                raise invalid("init_model", init_model, f"an MLP of sizes {list(expected)}")
            model = MLP.from_arrays(
                init_model.weights, init_model.biases, activation=settings["activation"],
                output=settings["output"], negative_slope=settings["negative_slope"],
            )
            if model.dtype != settings["dtype"]:
                model = MLP.from_arrays(
                    [w.astype(settings["dtype"]) for w in model.weights],
                    [b.astype(settings["dtype"]) for b in model.biases],
                    activation=settings["activation"], output=settings["output"],
                    negative_slope=settings["negative_slope"],
                )
            return model
        return MLP(
            (n_features, *settings["hidden_sizes"], n_outputs),
            activation=settings["activation"],
            output=settings["output"],
            dtype=settings["dtype"],
            seed=settings["seed"],
            negative_slope=settings["negative_slope"],
        )

    def _batch_order(self, settings, n_samples: int) -> BatchOrder:
        return BatchOrder(n_samples, settings["batch_size"], seed=settings["seed"], shuffle=settings["shuffle"])

    def _training_config(self, settings) -> dict:
        """JSON-safe settings that a resumed run must share with the original."""
        return {
            "method": self.method,
            "loss": settings["loss"],
            "lr": settings["lr"],
            "momentum": settings["momentum"],
        }

    def _load_resume(self, resume, settings, data: TrainingData, order: BatchOrder) -> store.Checkpoint:
        ckpt = store.load_checkpoint(resume)
        expected_sizes = [data.n_features, *settings["hidden_sizes"], data.n_outputs]
        found = ckpt.model.get_config()
        mismatches = []
        if found["sizes"] != expected_sizes:
            mismatches.append(f"sizes {found['sizes']} != {expected_sizes}")
        for key in ("activation", "output"):
            if found[key] != settings[key]:
                mismatches.append(f"{key} {found[key]!r} != {settings[key]!r}")
        if found["dtype"] != settings["dtype"].name:
            mismatches.append(f"dtype {found['dtype']!r} != {settings['dtype'].name!r}")
        for key, value in self._training_config(settings).items():
            if key != "method" and ckpt.training.get(key) != value:
                mismatches.append(f"{key} {ckpt.training.get(key)!r} != {value!r}")
        if ckpt.batch_order != order.get_state():
            mismatches.append(f"batch order {ckpt.batch_order} != {order.get_state()}")
        if mismatches:
            raise store.StoreError(
                f"resume={str(resume)!r} does not match this training: " + "; ".join(mismatches)
            )
        return ckpt

    # -- results -----------------------------------------------------------------
    def _evaluate(self, model: MLP, validation, loss: str) -> dict:
        if validation is None:
            return {}
        Xv, yv = validation
        values = {"val_loss": model.loss(Xv, yv, loss)}
        if loss == "cross_entropy":
            values["val_accuracy"] = model.accuracy(Xv, yv)
        return values

    def _history_attrs(self, settings) -> dict:
        attrs = {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.items()}
        attrs["dtype"] = settings["dtype"].name
        attrs["method"] = self.method
        return {k: ("" if v is None else v) for k, v in attrs.items()}

    def _save_checkpoint(self, model, velocity, step, order, settings, extra=None, history=None) -> Path | None:
        """Checkpoint into ``checkpoint_dir`` (and the history so far beside it)."""
        if self.checkpoint_dir is None:
            return None
        if history is not None:
            store.save_history(history, Path(self.checkpoint_dir) / "history.zarr")
        ckpt = store.Checkpoint(
            model=model,
            velocity=velocity,
            step=step,
            batch_order=order.get_state(),
            training=self._training_config(settings),
            extra=extra or {},
        )
        return store.save_checkpoint(store.checkpoint_path(self.checkpoint_dir, step), ckpt)

    def save(self, path) -> Path:
        """Write the fitted model and optimiser state as a checkpoint store."""
        self._check_fitted()
        ckpt = store.Checkpoint(
            model=self.model_, velocity=self.velocity_, step=self.n_steps_,
            batch_order=self.batch_order_.get_state(), training=self._training_config(self._settings),
        )
        return store.save_checkpoint(path, ckpt)

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise RuntimeError(f"this {type(self).__name__} is not fitted yet; call fit first")


def _same(a, b) -> bool:
    try:
        return bool(a == b) if not isinstance(a, np.ndarray) else False
    except Exception:
        return False

