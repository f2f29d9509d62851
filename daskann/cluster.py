"""One entry point to a Dask client: embedded, existing, or a batch-system profile.

* ``client()`` starts an embedded :class:`distributed.LocalCluster` whose
  scheduler, workers and dashboard listen on 127.0.0.1 only, one thread per
  worker process and one BLAS thread per worker.
* ``client("tcp://host:8786")`` connects to a running scheduler, waiting at
  most ``timeout`` seconds; non-loopback addresses need ``tls://`` and a
  :class:`distributed.security.Security` unless ``insecure=True``.
* ``client(profile="slurm")`` starts a dask-jobqueue cluster from
  ``cluster/<profile>.yaml`` (or a path to such a file).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from pathlib import Path
from urllib.parse import urlparse

import dask
import yaml
from distributed import Client, LocalCluster
from distributed.security import Security

from daskann._validation import check_int, invalid

logger = logging.getLogger(__name__)

#: environment every worker process starts with: one BLAS thread per worker
BLAS_ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}

PROFILE_DIR = Path(__file__).resolve().parent.parent / "cluster"
JOBQUEUE_CLASSES = {"slurm": "SLURMCluster", "pbs": "PBSCluster"}


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_address(address: str, *, security=None, insecure: bool = False) -> str:
    """Validate a scheduler address; remote plain-TCP needs ``insecure=True``."""
    if not isinstance(address, str) or "://" not in address:
        raise invalid("address", address, "a scheduler address such as 'tcp://127.0.0.1:8786' or 'tls://host:8786'")
    parsed = urlparse(address)
    if parsed.scheme not in ("tcp", "tls", "inproc", "ucx", "ws", "wss"):
        raise invalid("address", address, "a tcp://, tls:// or ws(s):// scheduler address")
    if parsed.scheme in ("tcp", "ws") and not _is_loopback(parsed.hostname or "") and not insecure:
        raise invalid(
            "address",
            address,
            "a loopback address, or tls:// with a Security object for a remote scheduler "
            "(pass insecure=True to accept an unencrypted remote connection)",
        )
    return address


def local_cluster(
    n_workers: int | None = None,
    *,
    threads_per_worker: int = 1,
    memory_limit="auto",
    dashboard: bool = True,
    security: Security | bool | None = None,
    **kwargs,
) -> LocalCluster:
    """Embedded process-worker cluster bound to 127.0.0.1, BLAS on one thread."""
    n_workers = check_int("n_workers", n_workers if n_workers is not None else _default_workers(threads_per_worker))
    threads_per_worker = check_int("threads_per_worker", threads_per_worker)
    with dask.config.set({"distributed.nanny.pre-spawn-environ": dict(BLAS_ONE_THREAD)}):
        cluster = LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads_per_worker,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0" if dashboard else None,
            memory_limit=memory_limit,
            security=security,
            **kwargs,
        )
    return cluster


def _default_workers(threads_per_worker: int) -> int:
    return max(1, (os.cpu_count() or 1) // threads_per_worker)


def load_profile(profile: str | os.PathLike) -> dict:
    """Read a jobqueue profile: ``{"kind": "slurm"|"pbs", "cluster": {...}, "scale": {...}}``."""
    path = Path(profile)
    if not path.suffix:
        path = PROFILE_DIR / f"{profile}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
        raise invalid("profile", str(profile), "a file path or one of " + ", ".join(map(repr, available)))
    spec = yaml.safe_load(path.read_text()) or {}
    kind = spec.get("kind")
    if kind not in JOBQUEUE_CLASSES:
        raise invalid(f"kind in {path}", kind, "one of " + ", ".join(map(repr, JOBQUEUE_CLASSES)))
    spec.setdefault("cluster", {})
    spec.setdefault("scale", {})
    return spec


def jobqueue_cluster(profile: str | os.PathLike, **overrides):
    """Build (but do not scale) the dask-jobqueue cluster of a profile."""
    try:
        import dask_jobqueue
    except ImportError as exc:  # optional extra
        raise ImportError("profiles need dask-jobqueue: pip install 'daskann[hpc]'") from exc
    spec = load_profile(profile)
    options = {**spec["cluster"], **overrides}
    # worker environment: one BLAS thread each, as on the embedded cluster
    prologue = list(options.pop("job_script_prologue", []))
    prologue += [f"export {k}={v}" for k, v in BLAS_ONE_THREAD.items()]
    options["job_script_prologue"] = prologue
    cls = getattr(dask_jobqueue, JOBQUEUE_CLASSES[spec["kind"]])
    return cls(**options), spec["scale"]


def client(
    address: str | None = None,
    *,
    profile: str | os.PathLike | None = None,
    n_workers: int | None = None,
    threads_per_worker: int = 1,
    security: Security | None = None,
    insecure: bool = False,
    timeout: float = 10,
    dashboard: bool = True,
    quiet: bool = False,
) -> Client:
    """A client on an embedded cluster, an existing scheduler, or a jobqueue profile.

    Parameters
    ----------
    address : str, optional
        Scheduler to connect to. The wait is bounded by ``timeout``.
    profile : str or path, optional
        Name of a profile in ``cluster/`` (``"slurm"``, ``"pbs"``) or a YAML path.
    n_workers : int, optional
        Workers of the embedded cluster (default: one per core), or jobs to
        start for a profile (default: the profile's ``scale``).
    threads_per_worker : int
        Threads per embedded worker; 1 keeps results reproducible.
    security : distributed.security.Security, optional
        TLS credentials for ``tls://`` addresses.
    insecure : bool
        Accept a plain ``tcp://`` address that is not loopback.
    timeout : float
        Seconds to wait for a scheduler.
    dashboard : bool
        Serve the dashboard (on 127.0.0.1 for embedded clusters).
    quiet : bool
        Do not log the dashboard link.

    Returns
    -------
    distributed.Client
        Closing it also closes any cluster this function started.
    """
    if address is not None and profile is not None:
        raise invalid("address/profile", (address, profile), "one of address or profile, not both")
    if address is not None:
        check_address(address, security=security, insecure=insecure)
        try:
            c = Client(address, security=security, timeout=timeout)
        except (OSError, TimeoutError) as exc:
            raise ConnectionError(
                f"address={address!r}: no scheduler answered within {timeout:g} s ({exc})"
            ) from exc
    elif profile is not None:
        cluster, scale = jobqueue_cluster(profile)
        if n_workers is not None:
            scale = {"jobs": check_int("n_workers", n_workers)}
        cluster.scale(**scale)
        c = Client(cluster, security=security, timeout=timeout)
        c._daskann_owns_cluster = True
    else:
        cluster = local_cluster(n_workers, threads_per_worker=threads_per_worker, dashboard=dashboard,
                                security=security)
        c = Client(cluster, timeout=timeout)
        c._daskann_owns_cluster = True
    if not quiet and c.dashboard_link and dashboard:
        logger.warning("Dask dashboard: %s", c.dashboard_link)
    return c


def close(c: Client) -> None:
    """Close a client and, if :func:`client` started it, its cluster."""
    cluster = c.cluster if getattr(c, "_daskann_owns_cluster", False) else None
    c.close()
    if cluster is not None:
        cluster.close()


@contextlib.contextmanager
def resolve_client(c: Client | None = None, *, n_workers: int | None = None):
    """The given client, the current default one, or a temporary embedded cluster.

    Trainers use this for ``client=None``: the embedded cluster is closed on exit.
    """
    if c is not None:
        if not isinstance(c, Client):
            raise invalid("client", type(c).__name__, "a distributed.Client or None", TypeError)
        yield c
        return
    try:
        from distributed import default_client

        yield default_client()
        return
    except ValueError:
        pass
    owned = client(n_workers=n_workers, quiet=True)
    try:
        yield owned
    finally:
        close(owned)


def worker_addresses(c: Client) -> list[str]:
    """Addresses of the client's workers, sorted by worker name for a stable order."""
    info = c.scheduler_info(n_workers=-1)["workers"]
    return [addr for addr, _ in sorted(info.items(), key=lambda kv: (str(kv[1].get("name")), kv[0]))]


__all__ = ["BLAS_ONE_THREAD", "check_address", "client", "close", "jobqueue_cluster", "load_profile",
           "local_cluster", "resolve_client", "worker_addresses"]
