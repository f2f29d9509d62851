"""A :class:`distributed.Client` pickled and copied as a reference to its scheduler, never as a connection.

Why
---
A parallel trainer stores ``client=c`` unchanged, as scikit-learn's contract asks
(``get_params()["client"] is c``), and much of the ecosystem copies or pickles every
parameter: ``copy.deepcopy``, :func:`sklearn.base.clone` of a parameter,
``joblib.dump`` of a fitted model at the end of a job, ``joblib.hash`` (scikit-learn's
checks compare parameters by it), dask's ``tokenize``. A client holds sockets, an event
loop and threads, so all of these failed ("cannot pickle 'socket' object"), and a copy of
a connection would be a second connection even where it could be made.

Design
------
As :class:`distributed.Future`, which pickles as its key alone (``Future.__reduce__``
returns ``(Future, (key,))``) and binds to the client of whichever process loads it, a
client pickles as a reference: its ``id`` and its scheduler's address. Loading one
resolves, without opening any connection, to

1. the same client object, while it lives in this process and is not closing or closed:
   a deep copy (or a pickle round trip in one process) of a live client is that client;
2. else a running, synchronous client of this process connected to the same scheduler
   (the default client first): a model loaded in another process of the same job;
3. else ``None``: a trainer loaded where its cluster is gone then acts as with
   ``client=None`` (the default client, or an embedded cluster).

Connecting to the address on load was not chosen: every copy would open a new connection
(a deep copy would not be the same client), loading would hang or fail where the scheduler
is gone, and loading a file would connect wherever the file says. Leaving the client out
in the trainers' ``__getstate__`` alone was not enough: ``clone``, ``deepcopy`` and
``joblib.hash`` also meet the client by itself, in ``get_params()``.

Scope
-----
The reducer is registered with :mod:`copyreg`, which ``pickle``, ``copy``, joblib and
cloudpickle consult, for exactly :class:`distributed.Client` (the dispatch table is looked
up by exact type: subclasses are left alone), once this module is imported, as every
trainer's module does; distributed's class itself is not changed. In a process that
imported daskann, other code that pickles a client thus gets this reference where
distributed raised ``TypeError``.
"""

from __future__ import annotations

import copyreg

from distributed import Client, default_client

__all__ = ["client_reference", "resolve_client_reference"]

#: states in which a client may still serve: distributed's ``Client.status`` values before it closes
_SERVING = ("newly-created", "connecting", "running")


def _scheduler_address(c: Client) -> str | None:
    """The address of ``c``'s scheduler: an rpc once started, the address given before, None once closed."""
    scheduler = c.scheduler
    return scheduler if isinstance(scheduler, str) or scheduler is None else scheduler.address


def client_reference(c: Client):
    """``copyreg`` reducer of a client: rebuilt by :func:`resolve_client_reference` from its id and scheduler address.

    Parameters
    ----------
    c : distributed.Client

    Returns
    -------
    tuple
        ``(resolve_client_reference, (id, address))``, as ``__reduce__`` returns.
    """
    return resolve_client_reference, (c.id, _scheduler_address(c))


def resolve_client_reference(client_id: str, address: str | None) -> Client | None:
    """The client of this process that a pickled client refers to, else None; never a new connection.

    Parameters
    ----------
    client_id : str
        ``Client.id`` of the pickled client.
    address : str or None
        Its scheduler's address (None: it was closed when pickled).

    Returns
    -------
    distributed.Client or None
        The client itself while it serves in this process, else a running synchronous client
        of this process on the same scheduler (the default one first), else None.
    """
    clients = list(Client._instances)
    for c in clients:
        if c.id == client_id and c.status in _SERVING:
            return c
    if address is None:
        return None
    try:
        default = [default_client()]
    except ValueError:
        default = []
    for c in default + clients:
        # an asynchronous client cannot run a trainer's blocking calls: it is not taken for another
        if c.status == "running" and not c.asynchronous and _scheduler_address(c) == address:
            return c
    return None


copyreg.pickle(Client, client_reference)
