"""Package attributes imported when first used (PEP 562 module ``__getattr__``).

The package ``__init__`` modules of daskann import nothing heavy: a public
name loads its module the first time it is looked up, so ``daskann --help``
and ``import daskann`` do not wait for scikit-learn, distributed, xarray and
zarr (seconds on a cold shared file system).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping


def attach(
    package: str, attributes: Mapping[str, str], submodules: Iterable[str] = ()
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a package whose names load on first use.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    attributes : mapping of str to str
        Each name the package offers and the module that defines it.
    submodules : iterable of str
        Submodules offered as attributes (``daskann.config``), imported when
        first looked up as such.

    Returns
    -------
    __getattr__ : callable
        Imports the module of a name on its first look-up and keeps the value
        in the package, so later look-ups do not come back here; any other
        name raises ``AttributeError``.
    __dir__ : callable
        The names the package offers (``attributes`` and ``submodules``),
        loaded or not.
    """
    attributes = dict(attributes)
    submodules = frozenset(submodules)

    def __getattr__(name: str):
        if name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        elif name in attributes:
            value = getattr(importlib.import_module(attributes[name]), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(attributes) | submodules)

    return __getattr__, __dir__


__all__ = ["attach"]
