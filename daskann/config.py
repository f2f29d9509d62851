"""daskann's settings in Dask's configuration, under the ``daskann`` key.

The defaults ship in ``daskann/daskann.yaml`` and are registered with
:func:`dask.config.update_defaults` when this module is imported: by every
module that reads a setting, on the first use of a name of the ``daskann``
package, by ``import daskann`` where dask is loaded already, and by the
command line where dask's own loads it (``dask config get daskann``). The
usual Dask mechanisms override them: :func:`dask.config.set`,
``DASK_DASKANN__...`` environment variables and YAML files in Dask's
configuration folders. Code reads them when it needs them (:func:`seconds`,
:func:`count`), never at import, so an override applies to the next call.
Nothing is written to disk unless :func:`ensure_file` is called.

Examples
--------
>>> import dask
>>> from daskann import config
>>> with dask.config.set({"daskann.npt.poll-interval": "1s"}):
...     config.seconds("npt.poll-interval")
1.0
"""

from __future__ import annotations

import os
from importlib import resources

import dask
import dask.config
import yaml
from dask.utils import parse_timedelta

#: the shipped defaults, as the text of daskann/daskann.yaml
_DEFAULTS_FILE = resources.files("daskann") / "daskann.yaml"


def _register_defaults() -> None:
    dask.config.update_defaults(yaml.safe_load(_DEFAULTS_FILE.read_text(encoding="utf-8")))


def get(key: str):
    """The current value of ``daskann.<key>``, e.g. ``get("npt.poll-interval")``."""
    return dask.config.get(f"daskann.{key}")


def seconds(key: str) -> float:
    """A duration setting (``"500ms"``, ``"30s"``, or a number of seconds) in seconds."""
    value = get(key)
    try:
        return float(parse_timedelta(value, default="seconds"))
    except (KeyError, TypeError, ValueError):  # dask raises KeyError for an unknown unit
        raise ValueError(
            f"daskann.{key}={value!r} is not valid: expected a duration such as '500ms' or '30s' "
            "(check dask.config.set calls, DASK_DASKANN__ variables and Dask's YAML files)"
        ) from None


def count(key: str) -> int:
    """A non-negative integer setting (attempts, replays, restarts)."""
    value = get(key)
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(
            f"daskann.{key}={value!r} is not valid: expected a non-negative integer "
            "(check dask.config.set calls, DASK_DASKANN__ variables and Dask's YAML files)"
        )
    return int(value)


def ensure_file(destination: str | None = None, *, comment: bool = True) -> str:
    """Copy the default settings into Dask's user configuration folder, if not there yet.

    Only this function writes the file; importing daskann never does.

    Parameters
    ----------
    destination : str, optional
        File or folder to write to (default: ``~/.config/dask``, or
        ``$DASK_CONFIG``).
    comment : bool
        Comment every value out, so the file documents the settings without
        pinning them.

    Returns
    -------
    str
        The path of the settings file.
    """
    with resources.as_file(_DEFAULTS_FILE) as source:
        dask.config.ensure_file(source=str(source), destination=destination, comment=comment)
    folder = destination if destination is not None else dask.config.PATH
    folder = os.path.expanduser(folder)
    return folder if folder.endswith((".yaml", ".yml")) else os.path.join(folder, "daskann.yaml")


_register_defaults()

__all__ = ["count", "ensure_file", "get", "seconds"]
