"""Option groups: a trainer's rarer method knobs as one parameter each (``None``, a dict, or an options object).

A trainer keeps its constructor short by taking, say, every MGRIT solver knob
as one ``solver`` parameter, as pymgrit keeps its solver apart from the
problem. The parameter is ``None`` (every default), a dict of the options to
change, or the group's options object (a :class:`OptionGroup`); the trainer
stores it unchanged and resolves it in ``fit``, where a key or value that is
not valid fails before any task runs, named as ``solver['cfactor']``.

``trainer.set_params(solver__cfactor=2)`` sets one option whichever the form:
an options object is changed in place (scikit-learn's nested parameters), a
dict or ``None`` is replaced by a new dict holding the change.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping

from sklearn.base import BaseEstimator

from daskann._validation import OptionName, grouped, invalid, option_name

__all__ = [
    "CheckpointOptions",
    "GroupedOptions",
    "NetworkOptions",
    "OptionGroup",
    "SGDOptions",
    "group_names",
    "resolve_group",
]


class OptionGroup(BaseEstimator):
    """Base of the options objects: keywords stored unchanged; ``get_params``, ``set_params``, ``clone`` and the
    repr come from :class:`sklearn.base.BaseEstimator`.

    A subclass lists its options as keywords of ``__init__`` with their
    defaults and stores them with ``self._store(locals())``; ``group`` is the
    trainer parameter it is given as.
    """

    group = "options"
    #: the option a bare value other than a dict stands for (``checkpoint="runs/a"``: its folder), if any
    shorthand: str | None = None
    #: how a trainer's checked settings name an option of the group: this prefix, then the option's name
    setting_prefix = ""

    def _store(self, arguments: dict) -> None:
        for name in self._get_param_names():
            setattr(self, name, arguments[name])

    @classmethod
    def defaults(cls) -> dict:
        """Every option of the group at its default."""
        return cls().get_params(deep=False)

    @classmethod
    def _expected_keys(cls) -> str:
        return f"one of the {cls.group} options " + ", ".join(repr(k) for k in cls._get_param_names())

    @classmethod
    def name_of(cls, option) -> OptionName:
        """How errors name ``option`` of this group, as the user sets it: ``solver['cfactor']``."""
        return grouped(cls.group, option)

    @classmethod
    def check_key(cls, key, value) -> None:
        """Refuse ``key`` (holding ``value``) unless it names an option of the group."""
        if not isinstance(key, str) or key not in cls._get_param_names():
            raise invalid(cls.name_of(key), value, cls._expected_keys())


def resolve_group(value, cls: type[OptionGroup]) -> dict:
    """Every option of group ``cls``: its defaults, overridden by ``value`` (None, a mapping or a ``cls``).

    Raises
    ------
    ValueError
        A key that names no option of the group (named as ``group['key']``).
    TypeError
        ``value`` of another type.
    """
    options = cls.defaults()
    if value is None:
        return options
    value = _expand_shorthand(value, cls)
    if isinstance(value, cls):
        return value.get_params(deep=False)
    if isinstance(value, Mapping):
        for key, item in value.items():
            cls.check_key(key, item)
        return {**options, **value}
    raise invalid(cls.group, value, _expected_forms(cls), TypeError)


def group_names(*groups: type[OptionGroup]) -> Callable[[str], OptionName]:
    """How errors name an option: as an option of the first of ``groups`` declaring it, else by itself.

    For checks shared with entry points that take the options directly (the
    MGRIT solver): given this, they name ``cfactor`` as ``solver['cfactor']``.
    A partial, so a solver holding it still pickles.
    """
    return functools.partial(_name_in_groups, groups)


def _name_in_groups(groups: tuple[type[OptionGroup], ...], option: str) -> OptionName:
    for group in groups:
        if option in group._get_param_names():
            return group.name_of(option)
    return option_name(option)


def _expand_shorthand(value, cls: type[OptionGroup]):
    """``value`` as a dict of the group's shorthand option when it is such a bare value (a path), else unchanged."""
    if cls.shorthand is not None and isinstance(value, (str, os.PathLike)):
        return {cls.shorthand: value}
    return value


def _expected_forms(cls: type[OptionGroup]) -> str:
    forms = f"None, a dict of {cls.group} options or {cls.__name__}(...)"
    return forms if cls.shorthand is None else f"a path (its {cls.shorthand!r}), {forms}"


class GroupedOptions:
    """Mixin of a trainer with option groups: ``set_params(group__option=value)`` for every form of the group.

    ``_option_groups`` maps a parameter to its :class:`OptionGroup` class.
    """

    _option_groups: dict[str, type[OptionGroup]] = {}

    def set_params(self, **params):
        groups = type(self)._option_groups
        nested = {k: v for k, v in params.items() if k.partition("__")[0] in groups and "__" in k}
        super().set_params(**{k: v for k, v in params.items() if k not in nested})
        for key, value in nested.items():
            name, _, option = key.partition("__")
            cls, current = groups[name], _expand_shorthand(getattr(self, name), groups[name])
            if isinstance(current, BaseEstimator):
                current.set_params(**{option: value})
            elif current is None or isinstance(current, Mapping):
                cls.check_key(option, value)
                # a new dict: the one given (perhaps shared with a clone or a search's grid) stays as it was
                setattr(self, name, {**(current or {}), option: value})
            else:
                raise invalid(name, current, f"None, a dict or {cls.__name__}(...) to set {key}", TypeError)
        return self


class NetworkOptions(OptionGroup):
    """The ``network`` options of a trainer: the network's form beyond its widths and activation.

    Given as ``network=NetworkOptions(...)`` or a dict of the same keywords
    (``network={"dtype": "float32"}``), as PyTorch's layers take ``bias`` and
    ``dtype`` and its ``LeakyReLU`` its ``negative_slope``;
    ``trainer.set_params(network__dtype="float32")`` sets one option.

    Parameters
    ----------
    output : {"linear", "softmax"}
        Output activation of the last layer. ``loss="cross_entropy"`` takes the
        softmax of the last layer's values either way, so ``predict`` and
        ``predict_proba`` do not depend on it; it is what ``model_.forward``
        returns.
    negative_slope : float
        Slope of ``activation="leaky_relu"`` below zero.
    dtype : {"float64", "float32"}
        Floating-point type of the weights, the data and the arithmetic.
    """

    group = "network"

    def __init__(self, *, output="linear", negative_slope=0.01, dtype="float64"):
        self._store(locals())


class SGDOptions(OptionGroup):
    """The ``sgd`` options of a trainer: stochastic gradient descent's momentum and batch order.

    Given as ``sgd=SGDOptions(momentum=0.9)`` or ``sgd={"momentum": 0.9}``, as
    skorch takes ``optimizer__momentum`` beside ``lr``;
    ``trainer.set_params(sgd__momentum=0.9)`` sets one option (and is the name
    a search's grid uses).

    Parameters
    ----------
    momentum : float
        Heavy-ball momentum in ``[0, 1)`` (``torch.optim.SGD``'s).
    shuffle : bool
        Shuffle the rows each epoch (seeded by ``seed``) or walk them in order.
    """

    group = "sgd"

    def __init__(self, *, momentum=0.0, shuffle=True):
        self._store(locals())


class CheckpointOptions(OptionGroup):
    """The ``checkpoint`` options of a trainer: where and how often a run is checkpointed.

    Given as a folder (``checkpoint="runs/a"``), ``CheckpointOptions(...)`` or
    a dict of the same keywords (``checkpoint={"dir": "runs/a", "every": 100}``),
    as skorch's ``Checkpoint(dirname=...)`` and Keras's ``ModelCheckpoint``;
    ``trainer.set_params(checkpoint__every=100)`` sets one option.

    Parameters
    ----------
    dir : path or None
        Run folder for checkpoints and the history; ``None`` keeps everything
        in memory.
    every : int or None
        Checkpoint every this many steps (and at the end) when ``dir`` is set;
        ``None``: at the end only.
    """

    group = "checkpoint"
    shorthand = "dir"
    setting_prefix = "checkpoint_"

    def __init__(self, *, dir=None, every=None):
        self._store(locals())
