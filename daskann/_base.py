"""What every trainer shares: settings, input checks, model set-up, history, checkpoints."""

from __future__ import annotations

import abc
import contextlib
import copy
import inspect
import warnings
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, clone
from sklearn.utils import ClassifierTags, RegressorTags
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted, validate_data

from daskann import (
    _client_reference,  # noqa: F401  (a client parameter pickles and copies as a reference)
    store,
)
from daskann import _labels as labels
from daskann import _predictions as predictions
from daskann._dask_input import (
    check_dask_data,
    check_dask_features_layout,
    data_client,
    integers_as_float,
    is_dask_array,
    remote_call,
)
from daskann._history import HistoryRecorder
from daskann._options import (
    CheckpointOptions,
    GroupedOptions,
    NetworkOptions,
    SGDOptions,
    resolve_group,
)
from daskann._progress import ProgressBar
from daskann._validation import (
    Activation,
    Loss,
    OptionName,
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
from daskann.exceptions import BatchSizeClipped, TrainingDiverged
from daskann.nn import MLP

__all__ = ["BaseTrainer", "TrainingData", "TrainingDiverged", "constructor_arguments"]


#: bytes of metadata per checkpoint store, and for the history stored beside them (estimates)
CHECKPOINT_OVERHEAD = 64 * 1024
HISTORY_ALLOWANCE = 4 * 2**20
#: how errors name the checkpoint folder, as the user set it, and the two training lengths given together
CHECKPOINT_DIR = CheckpointOptions.name_of("dir")
STEPS_OR_EPOCHS = OptionName(("steps", "epochs"))


def constructor_arguments(settings: dict, **more) -> dict:
    """A trainer's keywords from flat settings and ``more``: ``momentum=0.9`` becomes ``sgd={"momentum": 0.9}``.

    For code that builds one trainer from another's settings (sub-models,
    fine-tuning, the command line); the groups' dicts hold only what is given.
    """
    # settings keep the groups' options flat (settings["momentum"], settings["checkpoint_every"])
    grouped = {
        cls.setting_prefix + option: (group, option)
        for group, cls in BaseTrainer._option_groups.items()
        for option in cls._get_param_names()
    }
    arguments: dict = {}
    for name, value in {**settings, **more}.items():
        if name in grouped:
            group, option = grouped[name]
            arguments.setdefault(group, {})[option] = value
        else:
            arguments[name] = value
    return arguments


def _evaluate_values(model: MLP, Xv, yv, loss: str) -> dict:
    values = {"val_loss": model.loss(Xv, yv, loss)}
    if loss == "cross_entropy":
        values["val_accuracy"] = model.accuracy(Xv, yv)
    return values


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


def _holds_dask_arrays(data: TrainingData) -> bool:
    return any(is_dask_array(a) for a in (data.X, data.y, *(data.validation or ())))


class BaseTrainer(GroupedOptions, BaseEstimator, metaclass=abc.ABCMeta):
    """Settings and bookkeeping shared by all trainers: scikit-learn estimators.

    A method subclasses it: it names itself in ``method``, lists its keywords in ``__init__``
    (body ``self._store_params(locals())``) and implements :meth:`fit`; one that continues training
    defines ``partial_fit`` as ``return self._partial_fit(...)`` and implements :meth:`_continue_fit`.
    ``fit`` records its checked inputs with :meth:`_keep_inputs` and its results with
    :meth:`_keep_results`. The other hooks (``_check_settings``, ``_check_batch_order``,
    ``_training_config``, ``_history_attrs``, ``_input_layout``, ``_fitted_output``, ``_logits``) have
    defaults a method may extend.

    ``__init__`` stores every keyword unchanged, so :func:`sklearn.base.clone`,
    ``get_params``/``set_params`` and searches such as
    :class:`~sklearn.model_selection.GridSearchCV` work (``fit`` parameters
    such as ``steps`` pass through). A fitted trainer predicts class labels
    (``loss="cross_entropy"``) or outputs (``loss="mse"``) and scores by
    accuracy or R^2.

    Parameters
    ----------
    hidden_sizes : sequence of int
        Widths of the hidden layers; input and output widths come from the data.
    activation : {"relu", "leaky_relu"}
    loss : {"mse", "cross_entropy"}
        ``"cross_entropy"`` makes a classifier, ``"mse"`` a regressor.
    lr : float
        Learning rate.
    batch_size : int
        Rows per step; larger than the data, it is clipped to the number of
        samples with a :class:`~daskann.exceptions.BatchSizeClipped` warning.
    epochs : int
        Passes over the data that ``fit`` trains for (as ``MLPClassifier``'s
        ``max_iter`` and skorch's ``max_epochs``), unless ``steps`` is set.
    steps : int or None
        Training steps (updates) that ``fit`` trains for; when set, it wins over
        ``epochs``. ``fit(..., steps=)`` or ``fit(..., epochs=)`` overrides both
        for that call.
    seed : int
        Seed of the initialisation and the batch order.
    verbose : int
        0 is silent; 1 shows progress on stderr: a bar on a terminal or in a
        notebook, a plain line each tenth of the run (and at least every 10 s)
        when stderr is a file, as in a batch job's log.
    network : dict or NetworkOptions, optional
        ``output``, ``negative_slope`` and ``dtype`` (``"float64"``, or
        ``"float32"``); see :class:`~daskann.NetworkOptions`.
    sgd : dict or SGDOptions, optional
        ``momentum`` and ``shuffle``; see :class:`~daskann.SGDOptions`.
    checkpoint : path, dict or CheckpointOptions, optional
        The run folder (``dir``) and how often to write a checkpoint there
        (``every``); ``None`` keeps everything in memory. See
        :class:`~daskann.CheckpointOptions`.
    """

    #: the method's name, in history attributes and checkpoints; every concrete trainer sets its own
    method = "base"
    #: what a fit leaves for ``predict``, ``save``, ``partial_fit`` and the command line (set by :meth:`_keep_results`)
    RESULT_ATTRIBUTES = ("model_", "velocity_", "n_steps_", "history_")
    #: whether fit reads dask-array data on the workers (serial training computes it on the client)
    _reads_dask = False
    #: the choices this trainer implements; the numeric core offers more, which a trainer widens to once it can
    _activations = ("relu", "leaky_relu")
    _outputs = ("linear", "softmax")
    _losses = ("mse", "cross_entropy")
    _option_groups = {"network": NetworkOptions, "sgd": SGDOptions, "checkpoint": CheckpointOptions}

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
    ):
        self._store_params(locals())

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not inspect.isabstract(cls) and cls.method == BaseTrainer.method:
            raise TypeError(f"{cls.__name__} must name its method: a class attribute method = '<name>'")

    def _store_params(self, arguments: dict) -> None:
        """Store every ``__init__`` keyword unchanged under its own name (scikit-learn's estimator contract).

        Each trainer's ``__init__`` lists its keywords (``get_params`` reads that signature) and passes
        ``locals()`` here, so no trainer repeats the keywords of another.
        """
        for name in self._get_param_names():
            setattr(self, name, arguments[name])

    # -- scikit-learn estimator protocol ------------------------------------------
    def __sklearn_clone__(self):
        # as sklearn's clone, which deep-copies every parameter, except that a
        # client is a connection: the clone shares it (a deep copy cannot be made)
        params = {
            name: value if name == "client" else clone(value, safe=False)
            for name, value in self.get_params(deep=False).items()
        }
        new = type(self)(**params)
        for name in ("_metadata_request", "_sklearn_output_config"):
            if name in self.__dict__:
                setattr(new, name, copy.deepcopy(self.__dict__[name]))
        return new

    def __getstate__(self):
        # a copy: Python's default state is the instance's own __dict__, which subclasses prune
        state = dict(super().__getstate__())
        data = state.get("_data")
        if data is not None and _holds_dask_arrays(data):
            # graphs over the cluster's keys (persisted futures): a saved trainer must load where that cluster
            # is gone, so it keeps no dask-array data, and partial_fit then asks for X
            del state["_data"]
        return state

    def _kept_data(self) -> TrainingData:
        """The data of the last call, which ``partial_fit`` without ``X`` continues on."""
        data = self.__dict__.get("_data")
        if data is None:
            raise invalid(
                "X",
                None,
                "training data: this trainer is a copy (pickled or deep-copied) of one fitted on dask arrays, "
                "which copies do not keep",
            )
        return data

    def __sklearn_is_fitted__(self) -> bool:
        # attributes such as partition_ or history_ can exist after a failed fit; a model cannot
        return hasattr(self, "model_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        if self._fitted_loss() == "cross_entropy":
            tags.estimator_type, tags.classifier_tags = "classifier", ClassifierTags()
        else:
            tags.estimator_type, tags.regressor_tags = "regressor", RegressorTags()
            tags.target_tags.multi_output = True  # one output column per target column
        return tags

    def _fitted_loss(self) -> str:
        """The loss of the fitted model (``set_params`` after fit does not change it), else the setting."""
        settings = self.__dict__.get("_settings")
        return settings["loss"] if settings is not None else self.loss

    def _has_proba(self) -> bool:
        if self._fitted_loss() != "cross_entropy":
            raise AttributeError(
                f"predict_proba needs loss='cross_entropy'; this {type(self).__name__} has "
                f"loss={self._fitted_loss()!r} (predict gives its outputs)"
            )
        return True

    @property
    def weights_(self) -> list:
        """Trained weight matrices, one per layer: numpy arrays of :attr:`model_` (NPT: dask arrays on the grid)."""
        return list(self.model_.weights)

    @property
    def biases_(self) -> list:
        """Trained bias vectors, one per layer (empty without biases), as :attr:`weights_`."""
        return list(self.model_.biases)

    def _input_layout(self) -> tuple[int, np.dtype]:
        """Input width and dtype of the fitted network (read without loading it where a trainer can)."""
        return self.model_.sizes[0], self.model_.dtype

    def _check_predict_input(self, X):
        """Checked numpy ``X``; a dask array stays lazy, its values checked by each block's task."""
        check_is_fitted(self)
        n_features, dtype = self._input_layout()
        if is_dask_array(X):
            X = integers_as_float(X, dtype)
            if hasattr(self, "n_features_in_"):
                self._set_input_features(X, reset=False)
            return predictions.checked_features(X, name="X", dtype=dtype, n_features=n_features)
        X = validate_data(self, X, reset=False, dtype=dtype, ensure_all_finite=False)
        return check_features(X, name="X", dtype=dtype, n_features=n_features)

    def _compute(self, array) -> np.ndarray:
        """A lazy prediction computed on the trainer's cluster where it runs, else by dask's default scheduler."""
        client = data_client(getattr(self, "client", None))
        if client is not None and client.status == "running":
            return client.compute(array, sync=True)
        return array.compute()

    def predict(self, X) -> np.ndarray:
        """Class labels (``loss="cross_entropy"``) or network outputs (``loss="mse"``).

        Parameters
        ----------
        X : array-like or dask array of shape (n_samples, n_features)
            A dask array (e.g. ``da.from_zarr``) is not read: the result is a
            dask array chunked along its rows, computed block by block where
            they are (a non-finite value raises then, naming its chunk).

        Returns
        -------
        ndarray or dask.array.Array
            Integer labels of shape ``(n_samples,)``, or outputs of shape
            ``(n_samples, n_outputs)`` (``(n_samples,)`` for one output); a
            dask array for dask-array ``X``.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before ``fit``.
        """
        X = self._check_predict_input(X)
        logits = self._logits(X)
        if self._fitted_loss() == "cross_entropy":
            return labels.decode(predictions.predicted_labels(logits), self.classes_)
        return predictions.predicted_outputs(logits, self._fitted_output())

    def _logits(self, X):
        """The network's last pre-activation for checked ``X`` (a trainer may compute it where its weights are).

        Lazy, block by block, for dask-array ``X``; a row chunk's columns are one chunk.
        """
        if is_dask_array(X):
            return predictions.model_logits(self.model_, X)
        return self.model_.forward(X)

    def _fitted_output(self) -> str:
        """The output activation of the fitted network."""
        return self.model_.output

    @available_if(_has_proba)
    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities: the softmax of the network's output (``loss="cross_entropy"`` only).

        Parameters
        ----------
        X : array-like or dask array of shape (n_samples, n_features)
            A dask array gives a lazy dask array, as for :meth:`predict`.

        Returns
        -------
        ndarray or dask.array.Array of shape (n_samples, n_classes)
            Rows sum to one; column ``c`` is class ``c``.
        """
        X = self._check_predict_input(X)
        return predictions.predicted_proba(self._logits(X))

    def score(self, X, y, sample_weight=None) -> float:
        """Accuracy (``loss="cross_entropy"``) or coefficient of determination R^2 (``loss="mse"``).

        Parameters
        ----------
        X : array-like or dask array of shape (n_samples, n_features)
            A dask array is read where it is: only the predictions reach the client.
        y : array-like or dask array
            True labels or targets.
        sample_weight : array-like of shape (n_samples,), optional

        Returns
        -------
        float
            Higher is better, as scikit-learn's searches expect.
        """
        from sklearn.metrics import accuracy_score, r2_score  # not needed to train: imported when scoring

        predicted = self.predict(X)
        if is_dask_array(predicted):
            predicted = self._compute(predicted)
        if is_dask_array(y):
            y = self._compute(y)
        metric = accuracy_score if self._fitted_loss() == "cross_entropy" else r2_score
        return float(metric(np.asarray(y), predicted, sample_weight=sample_weight))

    # -- the method's part ------------------------------------------------------
    @abc.abstractmethod
    def fit(self, X, y, **fit_params):
        """Train on ``X``, ``y`` and return ``self``.

        Every check runs before the first task: settings (:meth:`_check_settings` and the method's
        own options), data (:meth:`_check_data`), batch order (:meth:`_batch_order`), length
        (:meth:`_check_length`), resume. Then :meth:`_keep_inputs` records the checked inputs and, once
        trained (also after divergence, with the last finite state), :meth:`_keep_results` the results.
        """

    def _continue_fit(self, X, y, steps, epochs) -> None:
        """Train on from the fitted state: ``partial_fit`` after its first call (a method with ``partial_fit``).

        ``X`` None continues on the kept data; :meth:`_continue_on` switches to new data.
        """
        raise TypeError(f"{type(self).__name__} does not continue training: it defines no _continue_fit")

    # -- bookkeeping of a fit -------------------------------------------------------
    def _keep_inputs(self, settings: dict, data: TrainingData, order: BatchOrder) -> None:
        """The fit's checked settings, data and batch order (``partial_fit``, ``save`` and ``predict`` read them)."""
        self._settings, self._data, self.batch_order_ = settings, data, order

    def _keep_results(self, model, velocity, n_steps: int, history) -> None:
        """The fitted state: ``model_``, ``velocity_``, ``n_steps_`` and ``history_`` (an ``xarray.Dataset``)."""
        self.model_, self.velocity_ = model, velocity
        self.n_steps_, self.history_ = n_steps, history

    def _partial_fit(self, X, y, classes, steps, epochs):
        """``partial_fit``'s rules: the first call fits, later ones check ``classes`` and call :meth:`_continue_fit`."""
        if not self.__sklearn_is_fitted__():
            return self._first_partial_fit(X, y, classes, steps, epochs)
        self._check_partial_classes(classes)
        self._continue_fit(X, y, steps, epochs)
        return self

    def _continue_on(self, X, y, model) -> None:
        """The data a ``partial_fit`` trains on: the kept data (``X`` None), else ``X, y`` checked against ``model``.

        New data keeps the validation data of the fit, and gets a batch order of its own.
        """
        if X is None:
            self._kept_data()
            return
        # a copy of a trainer fitted on dask arrays keeps no data (BaseTrainer.__getstate__): no validation either
        validation = getattr(self.__dict__.get("_data"), "validation", None)
        self._data = self._check_data(X, y, None, self._settings, model=model, reset=False)
        self._data.validation = validation
        self.batch_order_ = self._batch_order(self._settings, self._data.n_samples)

    def _continued_history(self) -> HistoryRecorder:
        """A step history that starts with the rows of ``history_``, for training continued from the fit."""
        history = HistoryRecorder("step")
        history.extend_from(self.history_)
        return history

    # -- checks ---------------------------------------------------------------
    def _check_settings(self, eval_every=None) -> dict:
        """Validated copy of the settings, the groups' options and ``fit``'s ``eval_every`` among them.

        Raises before anything runs.
        """
        network = resolve_group(self.network, NetworkOptions)
        sgd = resolve_group(self.sgd, SGDOptions)
        checkpoint = self._checkpoint_options()
        # a grouped option is named as the user set it: sgd['momentum'], network['dtype']
        s = {
            "hidden_sizes": check_hidden_sizes(self.hidden_sizes),
            "activation": check_choice("activation", self.activation, self._activations),
            "output": check_choice(NetworkOptions.name_of("output"), network["output"], self._outputs),
            "loss": check_choice("loss", self.loss, self._losses),
            "lr": check_learning_rate(self.lr),
            "momentum": check_momentum(sgd["momentum"], SGDOptions.name_of("momentum")),
            **self._check_batch_order(sgd["shuffle"]),
            "seed": check_int("seed", self.seed, minimum=0),
            "dtype": check_float_dtype(network["dtype"], NetworkOptions.name_of("dtype")),
            "negative_slope": check_float(
                NetworkOptions.name_of("negative_slope"), network["negative_slope"], minimum=0.0
            ),
            "eval_every": None if eval_every is None else check_int("eval_every", eval_every),
            "checkpoint_every": None
            if checkpoint["every"] is None
            else check_int(CheckpointOptions.name_of("every"), checkpoint["every"]),
        }
        folder = checkpoint["dir"]
        if folder is not None:
            if not isinstance(folder, (str, Path)):
                raise invalid(CHECKPOINT_DIR, folder, "a folder path or None", TypeError)
            store.check_writable_folder(folder, CHECKPOINT_DIR)
            # another run writing this folder: refuse now, before any task or file is written
            store.RunLock(folder).check_free(CHECKPOINT_DIR)
        return s

    def _checkpoint_options(self) -> dict:
        """The ``checkpoint`` group's ``dir`` and ``every``, as set (checked by :meth:`_check_settings`)."""
        return resolve_group(self.checkpoint, CheckpointOptions)

    @property
    def _checkpoint_dir(self):
        """The run folder of ``checkpoint`` (None: in memory)."""
        return self._checkpoint_options()["dir"]

    def _check_batch_order(self, shuffle) -> dict:
        """``batch_size`` and ``shuffle``: an integer and a flag (serial training also takes more)."""
        return {"batch_size": check_int("batch_size", self.batch_size), "shuffle": bool(shuffle)}

    def _client(self):
        """The fit's client (:func:`daskann.cluster.resolve_client`), reporting queued jobs if ``verbose``."""
        from daskann.cluster import resolve_client  # parallel trainers only: SerialTrainer needs no distributed

        return resolve_client(self.client, verbose=bool(self.verbose))

    def _run_lock(self):
        """Exclusive claim on the checkpoint folder for the length of a fit (a no-op without one)."""
        if self._checkpoint_dir is None:
            return contextlib.nullcontext()
        return store.RunLock(self._checkpoint_dir)

    def _check_data(
        self, X, y, validation_data, settings, model: MLP | None = None, *, classes=None, reset: bool = True
    ) -> TrainingData:
        """Training data checked and converted as scikit-learn's estimators do, before anything runs.

        ``reset=False`` continues a fit (``partial_fit``): the features must match
        ``n_features_in_`` (and ``feature_names_in_``), the labels ``classes_``.
        ``classes`` (``partial_fit``'s) fixes the labels of a first fit. Class
        labels become their positions in ``classes_``; a ``batch_size`` larger
        than the data is clipped to it with a :class:`BatchSizeClipped` warning.
        """
        if model is not None and not isinstance(model, MLP):
            raise invalid("init_model", type(model).__name__, "an MLP or None", TypeError)
        if validation_data is not None and (
            not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2
        ):
            raise invalid("validation_data", type(validation_data).__name__, "a pair (X_val, y_val)", TypeError)
        n_in = model.sizes[0] if model is not None else None
        n_out = model.sizes[-1] if model is not None else None
        classify = settings["loss"] == "cross_entropy"
        classes = self.__dict__.get("_partial_classes") if classes is None else classes
        if classes is not None and classify:
            classes = labels.check_classes(classes)
        client = None
        if self._reads_dask and (is_dask_array(X) or is_dask_array(y)):
            # read on the workers; without a cluster yet the data is computed here, as for serial training
            client = data_client(getattr(self, "client", None))
        if client is not None:
            X = self._dask_layout(X, y, settings, n_in, reset=reset)
        else:
            X, y = self._validated_numpy(X, y, settings, reset=reset)
        if classify:
            fitted = self._fitted_classes(y, classes, n_out, client, reset=reset)
            y = labels.encode(y, fitted)
            n_out = n_out if n_out is not None else fitted.size
            if validation_data is not None:
                validation_data = (validation_data[0], labels.encode(validation_data[1], fitted, "validation_data[1]"))
        if client is not None:
            checked = check_dask_data(
                client, X, y, validation_data, loss=settings["loss"], dtype=settings["dtype"], n_in=n_in, n_out=n_out
            )
            data = TrainingData(*checked)
        else:
            data = self._numpy_data(X, y, validation_data, settings, n_in, n_out)
        if classify:
            self.classes_ = fitted
        elif reset:
            self.__dict__.pop("classes_", None)  # an earlier fit's, with another loss
        if not reset:
            # clipped to each call's data, as MLPClassifier's partial_fit: a small first block does not stick
            settings["batch_size"] = self._check_batch_order(settings["shuffle"])["batch_size"]
        self._clip_batch_size(settings, data.n_samples)
        return data

    def _dask_layout(self, X, y, settings, n_in, *, reset: bool):
        """Dask-array ``X`` with its layout checked (no values read), integers cast as numpy ``X`` is."""
        X = check_dask_features_layout(integers_as_float(X, settings["dtype"]), "X", n_in)
        if y is None:
            raise invalid(
                "y", None, f"targets: {type(self).__name__} requires y to be passed, but the target y is None"
            )
        self._set_input_features(X, reset=reset)
        return X

    def _fitted_classes(self, y, classes, n_out, client, *, reset: bool) -> np.ndarray:
        """``classes_`` of this fit: those of the first fit when continuing, else found in ``y`` (or ``classes``)."""
        if not reset:
            return self.classes_
        return labels.fit_classes(labels.unique_labels(y, client), classes=classes, n_outputs=n_out)

    def _validated_numpy(self, X, y, settings, *, reset: bool):
        """``X`` and ``y`` through scikit-learn's ``validate_data``: its messages, ``n_features_in_``, feature names.

        Sparse, complex, empty and 1-d input is refused in scikit-learn's words;
        integers and other real numbers are converted to the trained dtype.
        Non-finite values are left to :func:`check_features`, which names the first.
        """
        regression = settings["loss"] != "cross_entropy"
        return validate_data(
            self,
            X,
            y,
            reset=reset,
            dtype=settings["dtype"],
            ensure_all_finite=False,
            multi_output=regression,
            y_numeric=regression,
        )

    def _set_input_features(self, X, *, reset: bool) -> None:
        """``n_features_in_`` of dask-array input, as ``validate_data`` sets it for numpy (no names: no frame)."""
        if reset:
            self.n_features_in_ = X.shape[1]
            self.__dict__.pop("feature_names_in_", None)
        elif X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input."
            )

    def _numpy_data(self, X, y, validation_data, settings, n_in, n_out) -> TrainingData:
        dtype = settings["dtype"]
        X = check_features(X, name="X", dtype=dtype, n_features=n_in)
        if settings["loss"] != "cross_entropy":
            y = np.asarray(y, dtype=dtype)
        y, n_outputs = check_targets(y, loss=settings["loss"], n_samples=X.shape[0], dtype=dtype, n_outputs=n_out)
        validation = None
        if validation_data is not None:
            Xv = check_features(validation_data[0], name="validation_data[0]", dtype=dtype, n_features=X.shape[1])
            yv, _ = check_targets(
                validation_data[1],
                loss=settings["loss"],
                n_samples=Xv.shape[0],
                name="validation_data[1]",
                dtype=dtype,
                n_outputs=n_outputs,
            )
            validation = (Xv, yv)
        return TrainingData(X, y, n_outputs, validation)

    @staticmethod
    def _clip_batch_size(settings, n_samples: int) -> None:
        """A ``batch_size`` above the rows trains on all of them each step, as ``MLPClassifier`` does."""
        if settings["batch_size"] is not None and settings["batch_size"] > n_samples:
            warnings.warn(
                f"batch_size={settings['batch_size']} is larger than the {n_samples} samples; clipped to {n_samples}",
                BatchSizeClipped,
                stacklevel=4,
            )
            settings["batch_size"] = n_samples

    def _check_checkpoint_space(
        self, settings, sizes, start: int, stop: int, *, count: int | None = None, extra_steps: int = 0
    ) -> None:
        """Refuse, before any work, a run whose checkpoints cannot fit in the checkpoint folder.

        ``count`` checkpoints (by default those that ``checkpoint_every``
        makes between ``start`` and ``stop``, plus those of ``extra_steps``
        more) of the parameters and velocity of a network of ``sizes``.
        """
        if self._checkpoint_dir is None:
            return
        if count is None:
            every = settings["checkpoint_every"]
            count = 0
            for first, last in ((start, stop), (0, extra_steps)):
                if last > first:
                    count += 1 if not every else last // every - first // every + (last % every != 0)
        n_params = sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        per_checkpoint = 2 * n_params * settings["dtype"].itemsize + CHECKPOINT_OVERHEAD
        store.check_free_space(self._checkpoint_dir, count * per_checkpoint + HISTORY_ALLOWANCE, CHECKPOINT_DIR)

    def _check_length(self, steps, epochs, steps_per_epoch: int) -> int:
        """Steps to train: ``fit``'s ``steps`` or ``epochs`` where given (at most one), else the settings'.

        The settings' ``steps``, where set, wins over their ``epochs``.
        """
        check_int("epochs", self.epochs)
        if self.steps is not None:
            check_int("steps", self.steps)
        if steps is not None and epochs is not None:
            raise invalid(STEPS_OR_EPOCHS, (steps, epochs), "at most one of steps or epochs in fit")
        if steps is None and epochs is None:
            steps, epochs = self.steps, (self.epochs if self.steps is None else None)
        if steps is not None:
            return check_int("steps", steps)
        return check_int("epochs", epochs) * steps_per_epoch

    # -- partial_fit ------------------------------------------------------------
    def _first_partial_fit(self, X, y, classes, steps, epochs):
        """The first ``partial_fit``: a fit of one epoch (or ``steps`` / ``epochs``) whose labels may be ``classes``."""
        if X is None:
            raise invalid("X", None, "training data on the first call of partial_fit")
        self._partial_classes = classes
        try:
            return self.fit(X, y, steps=steps, epochs=1 if steps is None and epochs is None else epochs)
        finally:
            del self._partial_classes

    def _check_partial_classes(self, classes) -> None:
        """Later ``partial_fit`` calls may repeat ``classes``, not change them (scikit-learn's rule)."""
        if classes is None or self._fitted_loss() != "cross_entropy":
            return
        if not np.array_equal(labels.check_classes(classes), self.classes_):
            raise invalid("classes", classes, f"the classes of the first call, classes_={self.classes_.tolist()[:20]}")

    def _partial_length(self, steps, epochs) -> int:
        """Steps of one ``partial_fit`` call: ``steps``, ``epochs`` of the current data, or one epoch."""
        if steps is not None and epochs is not None:
            raise invalid(STEPS_OR_EPOCHS, (steps, epochs), "at most one of steps or epochs")
        if steps is not None:
            return check_int("steps", steps)
        return check_int("epochs", 1 if epochs is None else epochs) * self.batch_order_.steps_per_epoch

    # -- set-up -----------------------------------------------------------------
    def _initial_model(self, settings, n_features, n_outputs, init_model: MLP | None) -> MLP:
        sizes = (n_features, *settings["hidden_sizes"], n_outputs)
        bias, dtype = settings.get("bias", True), settings["dtype"]
        layers = {key: settings[key] for key in ("activation", "output", "negative_slope")}
        if init_model is None:
            return MLP(sizes, dtype=dtype, seed=settings["seed"], bias=bias, **layers)
        if not isinstance(init_model, MLP):
            raise invalid("init_model", type(init_model).__name__, "an MLP", TypeError)
        if tuple(init_model.sizes) != sizes:
            raise invalid("init_model", init_model, f"an MLP of sizes {list(sizes)}")
        if init_model.bias != bias:
            raise invalid("init_model", init_model, f"an MLP with bias={bias}, as this trainer's bias")
        model = MLP.from_arrays(init_model.weights, init_model.biases, bias=bias, **layers)
        if model.dtype != dtype:
            model = MLP.from_arrays(
                [w.astype(dtype) for w in model.weights], [b.astype(dtype) for b in model.biases], bias=bias, **layers
            )
        return model

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
        self._check_resume(resume, ckpt, settings, data, order)
        return ckpt

    def _check_resume(self, resume, ckpt, settings, data: TrainingData, order: BatchOrder) -> None:
        """Refuse a checkpoint (:class:`store.Checkpoint` or :class:`store.CheckpointInfo`) of another training."""
        expected_sizes = [data.n_features, *settings["hidden_sizes"], data.n_outputs]
        found = ckpt.model if isinstance(ckpt.model, dict) else ckpt.model.get_config()
        mismatches = []
        if found["sizes"] != expected_sizes:
            mismatches.append(f"sizes {found['sizes']} != {expected_sizes}")
        for key in ("activation", "output"):
            if found[key] != settings[key]:
                mismatches.append(f"{key} {found[key]!r} != {settings[key]!r}")
        if found["dtype"] != settings["dtype"].name:
            mismatches.append(f"dtype {found['dtype']!r} != {settings['dtype'].name!r}")
        bias, found_bias = settings.get("bias", True), found.get("bias", True)
        if found_bias != bias:
            mismatches.append(f"bias={bias} but the checkpoint's model has {'biases' if found_bias else 'none'}")
        for key, value in self._training_config(settings).items():
            if key != "method" and ckpt.training.get(key) != value:
                mismatches.append(f"{key} {ckpt.training.get(key)!r} != {value!r}")
        if ckpt.batch_order != order.get_state():
            mismatches.append(f"batch order {ckpt.batch_order} != {order.get_state()}")
        if mismatches:
            raise store.StoreError(f"resume={str(resume)!r} does not match this training: " + "; ".join(mismatches))

    # -- results -----------------------------------------------------------------
    def _evaluate(self, model: MLP, validation, loss: str) -> dict:
        if validation is None:
            return {}
        Xv, yv = validation
        if is_dask_array(Xv):  # evaluated on a worker, where the validation data lives
            return remote_call(_evaluate_values, model, Xv, yv, loss)
        return _evaluate_values(model, Xv, yv, loss)

    def _history_attrs(self, settings) -> dict:
        attrs = {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.items()}
        attrs["dtype"] = settings["dtype"].name
        attrs["method"] = self.method
        return {k: ("" if v is None else v) for k, v in attrs.items()}

    def _save_checkpoint(self, model, velocity, step, order, settings, extra=None, history=None) -> Path | None:
        """Checkpoint into the checkpoint folder (and the history so far beside it)."""
        if self._checkpoint_dir is None:
            return None
        if history is not None:
            store.save_history(history, Path(self._checkpoint_dir) / store.HISTORY_STORE)
        ckpt = store.Checkpoint(
            model=model,
            velocity=velocity,
            step=step,
            batch_order=order.get_state(),
            training=self._training_config(settings),
            extra=extra or {},
        )
        return store.save_checkpoint(store.checkpoint_path(self._checkpoint_dir, step), ckpt)

    def save(self, path) -> Path:
        """Write the fitted model and optimiser state as a checkpoint store."""
        check_is_fitted(self)
        ckpt = store.Checkpoint(
            model=self.model_,
            velocity=self.velocity_,
            step=self.n_steps_,
            batch_order=self.batch_order_.get_state(),
            training=self._training_config(self._settings),
        )
        return store.save_checkpoint(path, ckpt)

    def _progress_bar(self, total: int, label: str, *, unit: str = "step", initial: int = 0) -> ProgressBar:
        """The run's progress display: nothing with ``verbose=0``, a bar or plain lines from 1 on."""
        return ProgressBar(total, label, enabled=bool(self.verbose), unit=unit, initial=initial)
