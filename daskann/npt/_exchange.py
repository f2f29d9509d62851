"""Direct block messages between long-running tasks on different workers.

Resident NPT keeps each grid cell's blocks inside one long-lived task and
moves blocks between cells without the scheduler. A worker plugin installs a
receive handler on every worker (as dask's P2P shuffle does); the handler drops
each incoming block into a per-run mailbox, where the task thread picks it up
by its tag. Sends go out from the worker's event loop on connections taken from
the worker's own pool (one per peer for the run, given back at the end), all
blocks queued for one peer in one message, so the task thread never waits for
a send to finish and a Cannon step costs one message per neighbour.

A message is addressed by a *namespace* (one per resident run) and a string
*tag* that is unique within the run. Receives wait at most a given number of
seconds and then raise :class:`ExchangeTimeout`, so a dead or stuck peer turns
into a clear error instead of a hang.

Each message carries the wall-clock time its sender began writing it and the
mailbox notes when it arrived, so that a receiving task can tell how much of
its wait for a block was the block in transit (:attr:`Channel.waited`,
:attr:`Channel.transfer_waited`).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
import uuid
from collections import OrderedDict

import numpy as np
from distributed import WorkerPlugin, get_worker, secede
from distributed.protocol import to_serialize
from distributed.utils import sync

from daskann import config
from daskann._compat import pool_connect, pool_reuse
from daskann._validation import check_float, check_int, invalid
from daskann._wire import for_transfer
from daskann.exceptions import ExchangeAborted, ExchangeTimeout

PLUGIN_NAME = "daskann-npt-exchange"
PUT_OP = "daskann_npt_put"
ABORT_OP = "daskann_npt_abort"
#: blocks smaller than this travel as raw bytes inside the message
INLINE_BYTES = 256 * 1024
#: namespaces remembered as closed, so late messages of a finished run are dropped
_CLOSED_MEMORY = 1024


class Mailbox:
    """Blocks received for one run on one worker, keyed by tag."""

    def __init__(self):
        self._cond = threading.Condition()
        self._items: dict[str, object] = {}
        #: tag -> (sent, arrived) wall-clock seconds of the blocks that came in a message
        self._spans: dict[str, tuple] = {}
        self._error: str | None = None

    def put(self, tag: str, value, sent: float | None = None) -> None:
        with self._cond:
            self._items[tag] = value
            if sent is not None:
                self._spans[tag] = (sent, time.time())
            self._cond.notify_all()

    def span(self, tag: str) -> tuple | None:
        """``(sent, arrived)`` of a block taken out of the mailbox that came in a message, once."""
        with self._cond:
            return self._spans.pop(tag, None)

    def get(self, tag: str, timeout: float, describe=None, source: str | None = None):
        """Wait for ``tag`` for at most ``timeout`` seconds and take it out."""
        with self._cond:
            self._cond.wait_for(lambda: tag in self._items or self._error is not None, timeout)
            if tag in self._items:
                return self._items.pop(tag)
            if self._error is not None:
                raise ExchangeAborted(self._error)
        what = describe() if callable(describe) else (describe or f"message {tag!r}")
        raise ExchangeTimeout(
            f"{what} did not arrive within {timeout:g} s; the sending worker may have died, "
            "be stuck, or be overloaded (raise timeout= if the cluster is just slow)",
            source,
        )

    def abort(self, message: str) -> None:
        with self._cond:
            self._error = message
            self._items.clear()
            self._spans.clear()
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)


class ExchangePlugin(WorkerPlugin):
    """Worker plugin holding the mailboxes of every resident run on a worker.

    Registered once per cluster by :func:`ensure_plugin` (idempotent: a second
    registration keeps the first, so runs in flight keep their mailboxes).
    """

    idempotent = True
    name = PLUGIN_NAME

    def setup(self, worker) -> None:
        self.worker = worker
        self._lock = threading.Lock()
        self._mailboxes: dict[str, Mailbox] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._closing = False
        worker.handlers[PUT_OP] = self.receive
        worker.handlers[ABORT_OP] = self.abort_handler

    def teardown(self, worker) -> None:
        # the handlers stay (late blocks from peers are dropped quietly): only the runs end
        with self._lock:
            self._closing = True
            boxes, self._mailboxes = list(self._mailboxes.values()), {}
        for box in boxes:
            box.abort(f"worker {worker.address} is closing")

    # -- state shared by the event loop and task threads -----------------------
    def mailbox(self, namespace: str) -> Mailbox | None:
        """The run's mailbox, created on first use; None once the run is closed."""
        with self._lock:
            if self._closing or namespace in self._closed:
                return None
            box = self._mailboxes.get(namespace)
            if box is None:
                box = self._mailboxes[namespace] = Mailbox()
            return box

    def close(self, namespace: str, message: str | None = None) -> bool:
        """Forget a run: drop its mailbox and wake any task waiting in it."""
        with self._lock:
            box = self._mailboxes.pop(namespace, None)
            self._closed[namespace] = None
            while len(self._closed) > _CLOSED_MEMORY:
                self._closed.popitem(last=False)
        if box is not None:
            box.abort(message or f"resident run {namespace} was closed")
        return box is not None

    def namespaces(self) -> list[str]:
        with self._lock:
            return sorted(self._mailboxes)

    # -- comm handlers (run on the worker's event loop) ------------------------
    def receive(self, namespace: str, tags: list, data: list, sent: float | None = None) -> None:
        box = self.mailbox(namespace)
        if box is not None:
            for tag, value in zip(tags, data, strict=True):
                box.put(tag, _decode(value), sent)

    def abort_handler(self, namespace: str, message: str) -> None:
        box = self.mailbox(namespace)
        if box is not None:
            box.abort(message)


def ensure_plugin(client) -> None:
    """Register :class:`ExchangePlugin` on the cluster unless every worker has it.

    A worker leaving while it is asked (its job ended) does not answer; the scheduler hands a
    registered plugin to every worker that joins later, so the ones that answered decide.
    """
    present = client.run(lambda dask_worker: PLUGIN_NAME in dask_worker.plugins, on_error="ignore")
    if not present or not all(present.values()):
        client.register_plugin(ExchangePlugin(), name=PLUGIN_NAME)


def close_namespace(namespace: str, message: str | None = None, dask_worker=None) -> bool:
    """``client.run`` target: close a run's mailbox on this worker."""
    worker = dask_worker or get_worker()
    plugin = worker.plugins.get(PLUGIN_NAME)
    return bool(plugin is not None and plugin.close(namespace, message))


def open_namespaces(dask_worker=None) -> list[str]:
    """``client.run`` target: namespaces with a live mailbox on this worker."""
    worker = dask_worker or get_worker()
    plugin = worker.plugins.get(PLUGIN_NAME)
    return [] if plugin is None else plugin.namespaces()


class Channel:
    """A task thread's end of the exchange for one run on its worker.

    ``send`` only queues a block: :meth:`flush` (called by :meth:`recv`
    before it waits) hands everything queued to the worker's event loop in
    one hop, which writes all blocks for one peer as one message on a
    connection kept for the run (no reply, in order). Blocks for this same
    worker go straight into the mailbox. A sent array must not be modified
    afterwards.

    :attr:`waited` counts the seconds the task thread spent in :meth:`recv`,
    and :attr:`transfer_waited` the part of them while the awaited block was
    on its way (from its sender's write to its arrival here; clocks of
    different hosts make it approximate); the rest was waiting for peers.
    """

    def __init__(self, namespace: str, *, timeout: float, worker=None):
        self.worker = worker or get_worker()
        plugin = self.worker.plugins.get(PLUGIN_NAME)
        if plugin is None:
            raise RuntimeError(f"worker {self.worker.address} has no {PLUGIN_NAME} plugin; call ensure_plugin(client)")
        self.plugin = plugin
        self.namespace = namespace
        self.timeout = float(timeout)
        self.address = self.worker.address
        self._loop = self.worker.loop.asyncio_loop
        box = plugin.mailbox(namespace)
        if box is None:
            raise ExchangeAborted(f"resident run {namespace} was closed before it started on {self.address}")
        self._box = box
        self._outbox: dict[str, list] = {}
        # event-loop side: one stream per peer, and the first send failure
        self._streams: dict[str, _Stream] = {}
        self._failure: BaseException | None = None
        self.bytes_sent = 0
        self.messages_sent = 0
        self.waited = 0.0
        self.transfer_waited = 0.0

    # -- task thread -----------------------------------------------------------
    def send(self, address: str, tag: str, value: np.ndarray) -> None:
        if address == self.address:
            self._box.put(tag, value)
            return
        self._outbox.setdefault(address, []).append((tag, value))
        self.bytes_sent += int(getattr(value, "nbytes", 0))

    def flush(self) -> None:
        """Hand every queued block to the event loop (one thread hop)."""
        if self._outbox:
            outbox, self._outbox = self._outbox, {}
            self.messages_sent += len(outbox)
            self._loop.call_soon_threadsafe(self._enqueue, outbox)

    def recv(self, tag: str, describe=None, source: str | None = None):
        self.flush()
        start = time.time()
        try:
            value = self._box.get(tag, self.timeout, describe, source)
        except ExchangeAborted:
            self.check_sends()
            raise
        got = time.time()
        self.waited += got - start
        span = self._box.span(tag)
        if span is not None:
            self.transfer_waited += max(0.0, min(got, span[1]) - max(start, span[0]))
        return value

    def check_sends(self, *, wait: bool = False) -> None:
        """Raise if a send failed; with ``wait`` first deliver everything queued
        and give the connections back to the worker's pool."""
        if wait:
            self.flush()
            sync(self.worker.loop, self._close, callback_timeout=self.timeout)
        if self._failure is not None:
            raise self._failure

    def abort_peers(self, addresses, message: str) -> None:
        """Wake the peers' waiting receives with an error (best effort)."""
        for address in set(addresses) - {self.address}:
            asyncio.run_coroutine_threadsafe(self._abort(address, message), self._loop)

    # -- event loop ------------------------------------------------------------
    def _enqueue(self, outbox: dict) -> None:
        for address, items in outbox.items():
            stream = self._streams.get(address)
            if stream is None:
                stream = self._streams[address] = _Stream()
            stream.queue.extend(items)
            if stream.task is None:
                stream.task = asyncio.ensure_future(self._drain(address, stream))

    async def _drain(self, address: str, stream: _Stream) -> None:
        try:
            if stream.comm is None:
                stream.comm = await pool_connect(self.worker, address)
            while stream.queue:
                items, stream.queue = stream.queue, []
                await stream.comm.write(
                    {
                        "sent": time.time(),  # before the blocks are encoded: their copies count as transfer
                        "op": PUT_OP,
                        "namespace": self.namespace,
                        "tags": [tag for tag, _ in items],
                        "data": [_encode(value) for _, value in items],
                        "reply": False,
                    }
                )
        except Exception as exc:
            stream.queue = []
            if self._failure is None:
                self._failure = ConnectionError(f"sending blocks to worker {address} failed: {exc!r}")
                self._box.abort(f"sending blocks to worker {address} failed: {exc!r}")
        finally:
            stream.task = None

    def close(self) -> None:
        """Drop what is still queued and close the run's connections (failure path)."""
        self._outbox = {}
        try:
            sync(self.worker.loop, self._close, True, callback_timeout=config.seconds("npt.close-timeout"))
        except Exception:
            pass

    async def _close(self, abort: bool = False) -> None:
        for address, stream in self._streams.items():
            if abort and stream.task is not None:
                stream.task.cancel()
            while stream.task is not None:
                try:
                    await stream.task
                except asyncio.CancelledError:
                    break
            if stream.comm is not None:
                if not abort and self._failure is None and not stream.comm.closed():
                    pool_reuse(self.worker, address, stream.comm)
                else:
                    stream.comm.abort()
                stream.comm = None

    async def _abort(self, address: str, message: str) -> None:
        try:
            await asyncio.wait_for(
                self.worker.rpc(address).daskann_npt_abort(namespace=self.namespace, message=message), 5
            )
        except Exception:
            pass  # the peer is gone; its own timeout or the client's clean-up ends it


def _encode(array: np.ndarray):
    """Small blocks as raw bytes inside the message (far cheaper than dask
    serialisation per block); large ones as zero-copy frames."""
    if array.nbytes < INLINE_BYTES:
        return [array.tobytes(), array.dtype.str, list(array.shape)]
    return to_serialize(for_transfer(array))


def _decode(value):
    if isinstance(value, (list, tuple)):
        raw, dtype, shape = value
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape)
    return value


class _Stream:
    """Blocks waiting to go to one peer, the connection, and the writer task."""

    def __init__(self):
        self.queue: list = []
        self.comm = None
        self.task = None


# -- micro benchmark -----------------------------------------------------------
DEFAULT_SIZES = (8 * 1024, 64 * 1024, 512 * 1024, 8 * 1024 * 1024)


def _latency_pair(client, workers) -> list[str]:
    """The two workers to measure between: those given, or the cluster's first two."""
    if workers is None:
        available = sorted(client.sync(client.scheduler.identity, n_workers=-1)["workers"])
        if len(available) < 2:
            raise invalid("client", f"a cluster of {len(available)} worker", "a cluster with at least two workers")
        workers = available[:2]
    workers = list(workers)
    if len(workers) != 2 or workers[0] == workers[1]:
        raise invalid("workers", workers, "two different worker addresses")
    return workers


def _ping_pong(namespace: str, role: int, peer: str, sizes, repeats: int, timeout: float) -> dict:
    """Task body: bounce blocks of each size with the peer; role 0 times it."""
    secede()
    channel = Channel(namespace, timeout=timeout)
    times: dict[int, list[float]] = {}
    for nbytes in sizes:
        block = np.ones(max(1, nbytes // 8), dtype=np.float64)
        for r in range(repeats + 1):  # the first round opens connections: not timed
            if role == 0:
                t0 = time.perf_counter()
                channel.send(peer, f"{nbytes}:{r}:ping", block)
                channel.recv(f"{nbytes}:{r}:pong", lambda: f"pong from worker {peer}")
                if r:
                    times.setdefault(nbytes, []).append((time.perf_counter() - t0) / 2)
            else:
                got = channel.recv(f"{nbytes}:{r}:ping", lambda: f"ping from worker {peer}")
                channel.send(peer, f"{nbytes}:{r}:pong", got)
        channel.check_sends()
    channel.check_sends(wait=True)
    return {n: statistics.median(t) for n, t in times.items()}


def exchange_latency(client, sizes=DEFAULT_SIZES, *, repeats: int = 20, workers=None, timeout: float = 60.0) -> dict:
    """One-way time of a block message between two workers, by block size.

    Two long-running tasks bounce a float64 block back and forth over the
    exchange used by resident NPT (worker plugin handler, distributed comm);
    half the median round trip is the one-way time.

    Parameters
    ----------
    client : distributed.Client
    sizes : sequence of int
        Block sizes in bytes.
    repeats : int
        Timed round trips per size (after one untimed warm-up).
    workers : pair of str, optional
        The two worker addresses; the first two workers by default.
    timeout : float
        Seconds a message may take before the measurement fails.

    Returns
    -------
    dict
        ``{nbytes: seconds}``, the median one-way time per block size.

    Examples
    --------
    >>> exchange_latency(client, sizes=[65536])  # doctest: +SKIP
    {65536: 0.00061}
    """
    sizes = [check_int("sizes[]", s) for s in sizes]
    if not sizes:
        raise invalid("sizes", sizes, "at least one block size in bytes")
    repeats = check_int("repeats", repeats)
    timeout = check_float("timeout", timeout, minimum=0.0, min_inclusive=False)
    workers = _latency_pair(client, workers)
    ensure_plugin(client)
    namespace = f"daskann-npt-latency-{uuid.uuid4().hex[:12]}"
    futures = [
        client.submit(
            _ping_pong,
            namespace,
            role,
            workers[1 - role],
            sizes,
            repeats,
            timeout,
            key=f"{namespace}-{role}",
            workers=[workers[role]],
            allow_other_workers=False,
            pure=False,
        )
        for role in (0, 1)
    ]
    try:
        result = client.gather(futures)[0]
    finally:
        client.cancel(futures)
        client.run(close_namespace, namespace, workers=workers, on_error="ignore")
    return {int(n): float(result[n]) for n in sizes}
