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

import contextlib
from collections.abc import Mapping

from sklearn.base import BaseEstimator

from daskann._validation import invalid

__all__ = ["GroupedOptions", "OptionGroup", "group_errors", "resolve_group"]


class OptionGroup(BaseEstimator):
    """Base of the options objects: keywords stored unchanged; ``get_params``, ``set_params``, ``clone`` and the
    repr come from :class:`sklearn.base.BaseEstimator`.

    A subclass lists its options as keywords of ``__init__`` with their
    defaults and stores them with ``self._store(locals())``; ``group`` is the
    trainer parameter it is given as.
    """

    group = "options"

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
    def check_key(cls, key, value) -> None:
        """Refuse ``key`` (holding ``value``) unless it names an option of the group."""
        if not isinstance(key, str) or key not in cls._get_param_names():
            raise invalid(f"{cls.group}[{key!r}]", value, cls._expected_keys())


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
    if isinstance(value, cls):
        return value.get_params(deep=False)
    if isinstance(value, Mapping):
        for key, item in value.items():
            cls.check_key(key, item)
        return {**options, **value}
    raise invalid(cls.group, value, f"None, a dict of {cls.group} options or {cls.__name__}(...)", TypeError)


@contextlib.contextmanager
def group_errors(groups: dict[str, str]):
    """Name a group's option as the user set it in the errors raised inside (``cfactor=1``: ``solver['cfactor']=1``).

    ``groups`` maps an option to its group. Checks shared with other entry
    points (the MGRIT solver, the merge) name the option alone; a trainer runs
    them inside this context, so its errors name the parameter the user set.
    """
    try:
        yield
    except (ValueError, TypeError) as exc:
        if type(exc) not in (ValueError, TypeError):
            raise
        text = str(exc)
        for key in sorted(groups, key=len, reverse=True):
            if text.startswith(key) and text[len(key) : len(key) + 1] in ("=", "["):
                raise type(exc)(f"{groups[key]}[{key!r}]{text[len(key) :]}") from exc
        raise


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
            cls, current = groups[name], getattr(self, name)
            if isinstance(current, BaseEstimator):
                current.set_params(**{option: value})
            elif current is None or isinstance(current, Mapping):
                cls.check_key(option, value)
                # a new dict: the one given (perhaps shared with a clone or a search's grid) stays as it was
                setattr(self, name, {**(current or {}), option: value})
            else:
                raise invalid(name, current, f"None, a dict or {cls.__name__}(...) to set {key}", TypeError)
        return self
