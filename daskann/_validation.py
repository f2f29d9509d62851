"""Checks of user input, and the option strings of the public signatures as ``Literal`` types.

Every error names the parameter, the value and what would be valid. The runtime
checks accept exactly the strings of the ``Literal`` types: their tuples (named
beside each alias) are built with ``typing.get_args``, so a type checker and the
error message agree.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

import numpy as np

#: hidden-layer activation (``daskann.nn.ACTIVATIONS``)
Activation = Literal["relu", "leaky_relu", "sigmoid", "tanh"]
#: output activation (``daskann.nn.OUTPUTS``)
Output = Literal["linear", "softmax", "sigmoid", "tanh"]
#: loss (``daskann.nn.LOSSES``)
Loss = Literal["mse", "cross_entropy", "sse"]
#: floating-point type of weights and data
FloatDType = Literal["float32", "float64"]
#: data set of ``load_dataset`` and ``daskann train --dataset`` (``daskann.data.DATASETS``)
DatasetName = Literal["linear", "digits", "mnist1d", "mnist", "cifar10"]
#: NPT execution mode (``daskann.npt.trainer.MODES``)
NPTMode = Literal["auto", "graph", "resident"]
#: NPT graph-mode pipelining (``daskann.npt.trainer.PIPELINES``)
NPTPipeline = Literal["auto", "fused", "single", "double"]
#: where MGRIT's tasks run (``daskann.mgrit.trainer.SCHEDULERS``)
MGRITScheduler = Literal["distributed", "threads", "sync", "inprocess"]
#: MGRIT cycle
CycleType = Literal["V", "F"]
#: built-in MGRIT coarse propagators
CoarsePropagator = Literal["scaled", "repeat"]
#: how sub-models train (``daskann.partition.trainer.MODES``)
PartitionMode = Literal["parallel", "sequential"]
#: trainer of sub-models and of the fine-tune (``daskann.partition.trainer.SUB_TRAINERS``)
SubTrainer = Literal["serial", "npt"]
#: how overlapping sub-model weights combine (``daskann.partition.merge.COMBINES``)
Combine = Literal["mean", "sum"]

FLOAT_DTYPES = get_args(FloatDType)


@dataclass(frozen=True)
class OptionName:
    """How an error names a parameter: ``lr``, ``steps/epochs``, ``hidden_sizes[0]`` or ``solver['cfactor']``.

    Parameters
    ----------
    options : tuple
        The parameters named (two for a pair that conflicts: ``steps/epochs``).
    group : str, optional
        The option group that declares the option (``solver``), as the user set it.
    entry : str
        The entry of a sequence meant (``"[0]"``), after the name.
    """

    options: tuple[str, ...]
    group: str | None = None
    entry: str = ""

    def __str__(self) -> str:
        if self.group is None:
            return "/".join(self.options) + self.entry
        (option,) = self.options  # an option of a group is one key, perhaps not a string (a wrong key)
        return f"{self.group}[{option!r}]{self.entry}"

    def at(self, index: int) -> OptionName:
        """The name of entry ``index`` of this parameter's sequence."""
        return replace(self, entry=f"{self.entry}[{index}]")

    def flag_form(self, flags: dict[str, str]) -> str | None:
        """This name with each parameter's flag from ``flags`` (``--coarsening[0]``); None where one has none."""
        if not all(option in flags for option in self.options):
            return None
        return "/".join(flags[option] for option in self.options) + self.entry


def option_name(name: str | OptionName) -> OptionName:
    """``name`` as an :class:`OptionName`; a plain string names one parameter."""
    return name if isinstance(name, OptionName) else OptionName((name,))


def grouped(group: str, option: str) -> OptionName:
    """The name of ``option`` of option group ``group``: ``solver['cfactor']``."""
    return OptionName((option,), group)


def named_error(error: type[Exception], name: str | OptionName, detail: str) -> Exception:
    """An ``error`` that reads ``{name}={detail}`` and carries both parts.

    The parts are kept as ``option_name`` and ``detail`` so the command line
    names the parameter by its flag without parsing the message.
    """
    name = option_name(name)
    exc = error(f"{name}={detail}")
    exc.option_name, exc.detail = name, detail  # kept in the instance dict, so pickling keeps them
    return exc


def invalid(name: str | OptionName, value, expected: str, error=ValueError) -> Exception:
    """Build the standard error for a parameter ``name`` holding ``value``; it carries ``value`` and ``expected``."""
    exc = named_error(error, name, f"{_short_repr(value)} is not valid: expected {expected}")
    exc.value, exc.expected = value, expected
    return exc


def _short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_choice(name: str | OptionName, value, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise invalid(name, value, "one of " + ", ".join(repr(c) for c in choices))
    return value


def check_float_dtype(dtype, name: str | OptionName = "dtype") -> np.dtype:
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise invalid(name, dtype, "'float32' or 'float64'", TypeError) from None
    if resolved.name not in FLOAT_DTYPES:
        raise invalid(name, dtype, "'float32' or 'float64'", TypeError)
    return resolved


def check_folder(folder, name: str = "folder") -> Path:
    """``folder`` as an existing directory, or the standard error naming ``name``."""
    if isinstance(folder, bytes) or not isinstance(folder, (str, os.PathLike)):
        raise invalid(name, folder, "a path (str or os.PathLike) to a local folder", TypeError)
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise invalid(name, folder, "an existing local folder", FileNotFoundError)
    return path


def check_int(name: str | OptionName, value, *, minimum: int | None = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise invalid(name, value, "an integer", TypeError)
    value = int(value)
    if minimum is not None and value < minimum:
        bound = f"an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        raise invalid(name, value, bound)
    if maximum is not None and value > maximum:
        raise invalid(name, value, f"an integer <= {maximum}")
    return value


def check_float(
    name: str | OptionName,
    value,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise invalid(name, value, "a real number", TypeError)
    value = float(value)
    lo = "" if minimum is None else ("[" if min_inclusive else "(") + f"{minimum:g}"
    hi = "" if maximum is None else f"{maximum:g}" + ("]" if max_inclusive else ")")
    expected = "a finite number" + (f" in {lo or '(-inf'}, {hi or 'inf)'}" if lo or hi else "")
    if not math.isfinite(value):
        raise invalid(name, value, expected)
    if minimum is not None and (value < minimum or (value == minimum and not min_inclusive)):
        raise invalid(name, value, expected)
    if maximum is not None and (value > maximum or (value == maximum and not max_inclusive)):
        raise invalid(name, value, expected)
    return value


def check_learning_rate(lr, name: str | OptionName = "lr") -> float:
    return check_float(name, lr, minimum=0.0, min_inclusive=False)


def check_momentum(momentum, name: str | OptionName = "momentum") -> float:
    return check_float(name, momentum, minimum=0.0, maximum=1.0, max_inclusive=False)


def check_sizes(sizes, name: str | OptionName = "sizes") -> tuple[int, ...]:
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or len(sizes) < 2:
        raise invalid(name, sizes, "a sequence of at least two layer widths, e.g. [784, 128, 10]")
    return tuple(check_int(option_name(name).at(i), s, minimum=1) for i, s in enumerate(sizes))


def check_hidden_sizes(hidden, name: str | OptionName = "hidden_sizes") -> tuple[int, ...]:
    if isinstance(hidden, numbers.Integral) and not isinstance(hidden, bool):
        hidden = (hidden,)
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise invalid(name, hidden, "a sequence of hidden layer widths, e.g. (128, 64)", TypeError)
    return tuple(check_int(option_name(name).at(i), h, minimum=1) for i, h in enumerate(hidden))


def _as_numpy(array, name: str | OptionName) -> np.ndarray:
    if hasattr(array, "compute") and hasattr(array, "chunks"):
        array = array.compute()
    try:
        return np.asarray(array)
    except Exception as exc:  # ragged lists and the like
        raise invalid(name, type(array).__name__, "an array-like of numbers", TypeError) from exc


def non_finite(name: str, count: int, first=None, chunk=None) -> ValueError:
    """The error for ``count`` NaN or Inf values in array ``name`` (first position and chunk where known)."""
    where = ""
    if first is not None:
        where = f" (first at {first}" + ("" if chunk is None else f", in chunk {chunk}") + ")"
    return invalid(name, f"array with {count} NaN or Inf values{where}", "finite values")


def check_features_layout(X, name: str, n_features: int | None):
    """Shape and dtype of a feature array, numpy or dask alike (values are checked where they are)."""
    if X.ndim != 2:
        raise invalid(name, f"array of shape {X.shape}", "a 2-d array of shape (n_samples, n_features)")
    if not np.issubdtype(X.dtype, np.floating):
        raise invalid(name, f"array of dtype {X.dtype}", "a float32 or float64 array", TypeError)
    if X.shape[0] == 0:
        raise invalid(name, f"array of shape {X.shape}", "at least one sample")
    if n_features is not None and X.shape[1] != n_features:
        raise invalid(name, f"array of shape {X.shape}", f"{n_features} features, as the network's input layer")
    return X


def check_targets_layout(y, name: str, loss: str, n_samples: int, n_outputs: int | None):
    """Shape and dtype of the targets of ``loss``, numpy or dask alike; 1-d regression targets become a column."""
    if y.shape[:1] != (n_samples,):
        raise invalid(name, f"array of shape {y.shape}", f"{n_samples} rows, as X")
    if loss == "cross_entropy":
        if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
            raise invalid(name, f"array of shape {y.shape} and dtype {y.dtype}", "1-d integer class labels")
        return y
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2 or not np.issubdtype(y.dtype, np.floating):
        raise invalid(
            name, f"array of shape {y.shape} and dtype {y.dtype}", "a 2-d float array of regression targets", TypeError
        )
    if n_outputs is not None and y.shape[1] != n_outputs:
        raise invalid(name, f"array of shape {y.shape}", f"{n_outputs} columns, as the network's output layer")
    return y


def not_labels(name: str) -> ValueError:
    """The error for float labels that are not all finite whole numbers."""
    return invalid(name, "float array with non-integer values", "1-d integer class labels")


def check_label_range(name: str, low: int, high: int, n_outputs: int | None) -> int:
    """Output width that class labels from ``low`` to ``high`` need (``n_outputs`` where given and wide enough)."""
    if low < 0:
        raise invalid(name, f"labels with minimum {low}", "labels >= 0")
    classes = high + 1
    if n_outputs is not None and classes > n_outputs:
        raise invalid(name, f"labels up to {classes - 1}", f"labels below {n_outputs}, the network's output width")
    return n_outputs or classes


def check_features(X, *, name: str = "X", dtype=np.float64, n_features: int | None = None) -> np.ndarray:
    """A finite 2-d float array; integers and other types are refused, not cast."""
    X = check_features_layout(_as_numpy(X, name), name, n_features)
    bad = ~np.isfinite(X)
    if bad.any():
        raise non_finite(name, int(bad.sum()), first=tuple(int(i) for i in np.argwhere(bad)[0]))
    return np.ascontiguousarray(X, dtype=dtype)


def check_targets(y, *, loss: str, n_samples: int, name: str = "y", dtype=np.float64, n_outputs: int | None = None):
    """Targets for ``loss``: integer labels for cross-entropy, floats for MSE.

    Returns ``(y, n_outputs)``.
    """
    y = check_targets_layout(_as_numpy(y, name), name, loss, n_samples, n_outputs)
    if loss == "cross_entropy":
        if np.issubdtype(y.dtype, np.floating) and not (np.all(np.isfinite(y)) and np.all(y == np.round(y))):
            raise not_labels(name)
        labels = y.astype(np.int64)
        return labels, check_label_range(name, int(labels.min()), int(labels.max()), n_outputs)
    bad = ~np.isfinite(y)
    if bad.any():
        raise non_finite(name, int(bad.sum()))
    return np.ascontiguousarray(y, dtype=dtype), y.shape[1]
