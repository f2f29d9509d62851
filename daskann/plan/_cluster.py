"""Clusters the planner predicts for: described in a YAML file, shipped in a profile, or measured live.

A cluster is five numbers and the worker counts to predict for::

    workers: [1, 2, 4, 8, 16]
    flop_rate: 8.0e10      # float64 GEMM FLOP/s of one worker
    latency: 2.0e-6        # seconds per message
    bandwidth: 1.0e10      # bytes/s of one link
    task_overhead: 0.0     # scheduler seconds per task (0 for an MPI-like runtime)

and three optional ones, ``gemm_overhead`` (fixed seconds of a GEMM call),
``layer_overhead`` (seconds of the non-GEMM work of one layer in one training
step) and ``store_overhead`` (seconds of one zarr chunk read or written); they
default to 0 and matter for small nets only.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from daskann._validation import invalid

REQUIRED = ("flop_rate", "latency", "bandwidth", "task_overhead")
OPTIONAL = ("gemm_overhead", "layer_overhead", "store_overhead")
#: keys that may be zero (an MPI-like runtime has no task overhead)
ZERO_ALLOWED = ("task_overhead", "gemm_overhead", "layer_overhead", "store_overhead")


@dataclass(frozen=True)
class ClusterSpec:
    """The numbers the planner's models read (seconds, FLOP/s, bytes/s).

    Attributes
    ----------
    workers : tuple of int
        Worker counts to predict for.
    flop_rate : float
        float64 GEMM FLOP/s of one worker.
    latency : float
        Seconds per message between two workers.
    bandwidth : float
        Bytes per second of one worker-to-worker link.
    task_overhead : float
        Scheduler seconds per task (0 for an MPI-like runtime).
    gemm_overhead : float
        Fixed seconds of one GEMM call.
    layer_overhead : float
        Seconds of one layer's non-GEMM work in a training step.
    store_overhead : float
        Seconds of one chunk read or written in a zarr store (MGRIT's trajectories).
    name : str
        Where the numbers come from (a file, a profile, a live cluster).
    """

    workers: tuple
    flop_rate: float
    latency: float
    bandwidth: float
    task_overhead: float
    gemm_overhead: float = 0.0
    layer_overhead: float = 0.0
    store_overhead: float = 0.0
    name: str = "cluster"

    def to_dict(self) -> dict:
        """The YAML/JSON layout (without ``name``)."""
        d = asdict(self)
        d.pop("name")
        d["workers"] = list(self.workers)
        return d


def check_workers(value, name: str = "workers") -> tuple:
    """A non-empty list of positive integer worker counts, sorted and without repeats."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise invalid(name, value, "a non-empty list of positive integer worker counts, e.g. [1, 2, 4]")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise invalid(name, value, "a non-empty list of positive integer worker counts, e.g. [1, 2, 4]")
    return tuple(sorted({int(v) for v in value}))


def cluster_from_dict(spec, *, source: str = "cluster") -> ClusterSpec:
    """Check a cluster description (a mapping) and build its :class:`ClusterSpec`.

    Errors name the key, as ``flop_rate in mycluster.yaml=-1 is not valid: ...``.
    """
    if not isinstance(spec, dict):
        raise invalid(source, type(spec).__name__, "a YAML mapping with workers, " + ", ".join(REQUIRED))
    unknown = sorted(set(spec) - {"workers", *REQUIRED, *OPTIONAL})
    if unknown:
        raise invalid(f"keys of {source}", unknown, "only workers, " + ", ".join(REQUIRED + OPTIONAL))
    if "workers" not in spec:
        raise invalid(f"workers in {source}", None, "a list of positive integer worker counts (the key is missing)")
    workers = check_workers(spec["workers"], f"workers in {source}")
    values = {}
    for key in REQUIRED + OPTIONAL:
        if key not in spec:
            if key in REQUIRED:
                raise invalid(f"{key} in {source}", None, "a positive number (the key is missing)")
            continue
        value = _number(spec[key])
        positive = key not in ZERO_ALLOWED
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < 0 or (positive and value == 0):
            raise invalid(f"{key} in {source}", value, "a positive number" if positive else "a number >= 0")
        values[key] = float(value)
    return ClusterSpec(workers=workers, name=source, **values)


def _number(value):
    """``value`` as a float where YAML left a number such as ``1e9`` (no dot) as a string."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def load_cluster(path) -> ClusterSpec:
    """Read a cluster description from a YAML file (a ``plan:`` mapping inside a profile works too)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"cluster={str(path)!r} is not valid: expected an existing YAML file")
    spec = yaml.safe_load(path.read_text())
    if isinstance(spec, dict) and "plan" in spec and "kind" in spec:
        spec = spec["plan"]
    return cluster_from_dict(spec, source=path.name)


def profile_cluster(profile: str) -> ClusterSpec:
    """The typical values a dask-jobqueue profile carries under its ``plan:`` key."""
    import yaml

    from daskann.cluster import _profile_path

    path = Path(_profile_path(profile))
    spec = yaml.safe_load(path.read_text()) or {}
    if "plan" not in spec:
        raise invalid("profile", profile, f"a profile with a 'plan:' mapping ({path} has none)")
    return cluster_from_dict(spec["plan"], source=f"plan in {path.name}")


def write_cluster(cluster: ClusterSpec, path) -> Path:
    """Write ``cluster`` as a YAML file that :func:`load_cluster` reads back."""
    import yaml

    path = Path(path)
    header = f"# daskann plan cluster description ({cluster.name})\n"
    path.write_text(header + yaml.safe_dump(cluster.to_dict(), sort_keys=False))
    return path


# -- measuring a live cluster ------------------------------------------------------------
def _gemm_rate(n: int = 256, seconds: float = 0.1) -> float:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    a @ b
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        count += 1
    return 2.0 * n**3 * count / (time.perf_counter() - t0)


def _small_costs(repeats: int = 300) -> tuple[float, float]:
    """Seconds of a tiny GEMM call and of one tiny layer's non-GEMM work in a training step."""
    from daskann.nn import MLP, SGD

    rng = np.random.default_rng(0)
    s = rng.standard_normal((8, 8))
    t0 = time.perf_counter()
    for _ in range(repeats):
        s @ s
    gemm = (time.perf_counter() - t0) / repeats
    sizes = (8, 8, 8, 8, 8)
    model = MLP(sizes, seed=0)
    opt = SGD(0.01, 0.9)
    X, y = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    state = opt.init_state(model.params)
    t0 = time.perf_counter()
    for _ in range(repeats // 3):
        _, grad_w, grad_b = model.loss_and_gradients(X, y, "mse")
        opt.step(model.params, model.interleave(grad_w, grad_b), state)
    step = (time.perf_counter() - t0) / (repeats // 3)
    n_products = 3 * (len(sizes) - 1)  # the first layer's input gradient is computed too
    return gemm, max(step - n_products * gemm, 0.0) / (len(sizes) - 1)


def _store_cost(repeats: int = 20) -> float:
    """Seconds of one small chunk written or read in a zarr store on local disk, the store opened each time."""
    import tempfile

    import zarr

    with tempfile.TemporaryDirectory() as folder:
        zarr.open_array(f"{folder}/a.zarr", mode="w", shape=(repeats, 1024), chunks=(1, 1024), dtype="f8")
        row = np.ones(1024)
        t0 = time.perf_counter()
        for k in range(repeats):
            # a task opens the trajectory store, as MGRIT's tasks do
            zarr.open_array(f"{folder}/a.zarr", mode="r+")[k] = row
            zarr.open_array(f"{folder}/a.zarr", mode="r")[k]
        return (time.perf_counter() - t0) / (2 * repeats)


def _noop(*args):
    return None


def _payload(nbytes: int, *deps):
    return np.ones(max(nbytes // 8, 1))


def measure_cluster(client, *, workers=None, n_tasks: int = 200) -> ClusterSpec:
    """Measure a live cluster: GEMM rate, message latency, link bandwidth, per-task cost.

    Small timed GEMMs run on every worker at once (so workers sharing cores
    show it); a chain of dependent tiny tasks alternating between two workers
    gives the per-message latency; a few MB moved between them the bandwidth;
    a batch of no-op tasks the scheduler's cost per task.
    """
    names = sorted(client.scheduler_info()["workers"])
    if not names:
        raise invalid("client", "a cluster without workers", "a cluster with at least one worker")
    rates = [v for _ in range(3) for v in client.run(_gemm_rate, workers=names).values()]
    flop_rate = float(np.max(rates))  # the machine's rate: other load on it only ever lowers a sample
    small = client.run(_small_costs, workers=names[:1])
    gemm, layer = next(iter(small.values()))
    store = float(next(iter(client.run(_store_cost, workers=names[:1]).values())))
    prefix = f"daskann-plan-measure-{uuid.uuid4().hex[:8]}"
    client.gather(client.map(_noop, range(8), key=[f"{prefix}-warm-{k}" for k in range(8)], pure=False))
    t0 = time.perf_counter()
    futures = client.map(_noop, range(n_tasks), key=[f"{prefix}-batch-{k}" for k in range(n_tasks)], pure=False)
    client.gather(futures)
    task_overhead = (time.perf_counter() - t0) / n_tasks * len(names)  # the tasks ran side by side
    del futures
    hop, bandwidth = _links(client, names, prefix)
    # a dependent hop is a task's scheduling plus one message: keep the message's share
    latency = max(hop - task_overhead, 1e-2 * hop)
    count = len(names)
    counts = sorted({1, count} | {2**k for k in range(1, 12) if 2**k < count})
    return ClusterSpec(
        workers=tuple(counts),
        flop_rate=flop_rate,
        latency=latency,
        bandwidth=bandwidth,
        task_overhead=task_overhead,
        gemm_overhead=float(gemm),
        layer_overhead=float(layer),
        store_overhead=store,
        name=f"measured on {count} workers",
    )


def _links(client, names, prefix: str, hops: int = 16, nbytes: int = 16 * 2**20) -> tuple[float, float]:
    """Seconds of one dependent hop between two workers, and bytes/s of a block moved over one."""
    pair = names[:2] if len(names) > 1 else names * 2

    def chain(size: int, tag: str) -> float:
        prev = None
        t0 = time.perf_counter()
        for k in range(hops):
            deps = [prev] if prev is not None else []
            prev = client.submit(
                _payload, size, *deps, key=f"{prefix}-{tag}-{k}", workers=[pair[k % 2]], allow_other_workers=False
            )
        prev.result()
        return (time.perf_counter() - t0) / hops

    # medians of a few chains: a busy machine stalls single hops
    small = float(np.median([chain(8, f"small{r}") for r in range(3)]))
    if len(names) < 2:
        return small, 1e10  # nothing moves between workers on one worker
    large = float(np.median([chain(nbytes, f"large{r}") for r in range(3)]))
    return small, float(nbytes / max(large - small, nbytes / 1e10))
