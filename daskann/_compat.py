"""The private dask and distributed names daskann relies on, in one place.

Each of them is the only way to get something daskann needs:

* ``dask._task_spec`` (``Task``, ``TaskRef``, ``parse_input``): graph-mode
  steps are graphs of task objects sent to the scheduler in one message;
* ``distributed.client._current_client``: the current client of one thread
  only (:meth:`distributed.Client.as_current` also sets dask's global
  ``scheduler`` option, which is not thread-safe);
* ``ConnectionPool.connect`` / ``ConnectionPool.reuse`` (``worker.rpc``):
  resident mode keeps one comm per neighbour and hands it back to the
  worker's pool at the end of a run.

They are looked up when this module is imported, so a dask release that
moved one fails at once with an error naming the versions daskann supports,
not deep inside a training run.
"""

from __future__ import annotations

import contextlib

import dask
import distributed
from distributed.core import ConnectionPool
from packaging.version import Version

__all__ = [
    "MIN_VERSION",
    "SUPPORTED",
    "Task",
    "TaskRef",
    "parse_input",
    "pool_connect",
    "pool_reuse",
    "set_current_client",
    "unsupported",
]

#: oldest dask and distributed releases daskann is written for (as pyproject.toml)
MIN_VERSION = "2026.1"
SUPPORTED = f"dask and distributed >= {MIN_VERSION}"


def unsupported(what: str, cause: BaseException | None = None) -> ImportError:
    """The error for a private dask name that is missing or changed."""
    found = f"dask {dask.__version__}, distributed {distributed.__version__}"
    error = ImportError(f"daskann needs {what}, which {found} does not provide; daskann supports {SUPPORTED}")
    error.__cause__ = cause
    return error


def _check_versions() -> None:
    for module in (dask, distributed):
        if Version(module.__version__).release < Version(MIN_VERSION).release:
            raise unsupported(f"{module.__name__} >= {MIN_VERSION}")


_check_versions()

try:
    from dask._task_spec import Task, TaskRef, parse_input
except ImportError as exc:  # pragma: no cover - other dask versions
    raise unsupported("dask._task_spec.Task, TaskRef and parse_input", exc) from exc

try:
    from distributed.client import _current_client
except ImportError as exc:  # pragma: no cover - other distributed versions
    raise unsupported("distributed.client._current_client", exc) from exc

if not all(hasattr(ConnectionPool, name) for name in ("connect", "reuse")):  # pragma: no cover
    raise unsupported("distributed.core.ConnectionPool.connect and .reuse")


@contextlib.contextmanager
def set_current_client(client):
    """Make ``client`` the current client of this thread or task only (see :func:`daskann.cluster.current_client`)."""
    token = _current_client.set(client)
    try:
        yield client
    finally:
        _current_client.reset(token)


async def pool_connect(worker, address: str):
    """A comm to ``address`` from ``worker``'s connection pool (kept open by the caller)."""
    return await worker.rpc.connect(address)


def pool_reuse(worker, address: str, comm) -> None:
    """Hand a still-open comm back to ``worker``'s connection pool."""
    worker.rpc.reuse(address, comm)
