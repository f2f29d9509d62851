"""One entry point to a Dask client: embedded, existing, or a batch-system profile.

* ``client()`` starts an embedded :class:`distributed.LocalCluster` whose
  scheduler, workers and dashboard listen on 127.0.0.1 only, one thread per
  worker process and one BLAS thread per worker.
* ``client("tls://host:8786", security=...)`` connects to a running scheduler,
  waiting at most ``timeout`` seconds. A plain ``tcp://`` address that is not
  loopback is refused unless ``insecure=True``: Dask's tcp protocol is
  unauthenticated and anyone who reaches the scheduler can run code on it.
* ``client(profile="slurm")`` starts a dask-jobqueue cluster from a shipped
  profile (``daskann/profiles/<profile>.yaml``, documented copy in the
  repository's ``cluster/``) or a path to such a file.

See ``cluster/README.md`` for the profile format, the sbatch example, TLS and
reaching the dashboard through an SSH tunnel.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from urllib.parse import urlparse

import dask
import numpy  # noqa: F401  (threadpoolctl lists only libraries already loaded)
import yaml
from distributed import Client, LocalCluster, default_client, get_worker
from distributed.security import Security
from threadpoolctl import threadpool_info

from daskann import _batch, config
from daskann._compat import set_current_client
from daskann._validation import OptionName, check_float, check_int, invalid, named_error

logger = logging.getLogger(__name__)

#: environment every worker process starts with: one BLAS thread per worker
BLAS_ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}
#: and one malloc arena, so that a task thread's large blocks come from the heap a training run keeps
#: (:mod:`daskann._heap`) instead of fresh mappings of memory
WORKER_ENVIRON = {**BLAS_ONE_THREAD, "MALLOC_ARENA_MAX": "1"}

#: folder of the shipped profiles (package data); ``DASKANN_PROFILE_DIR`` adds folders searched first
PROFILE_DIR = resources.files("daskann") / "profiles"
JOBQUEUE_CLASSES = {"slurm": "SLURMCluster", "pbs": "PBSCluster"}
# "plan" holds typical values for `daskann plan` (daskann.plan), not read here
PROFILE_KEYS = ("kind", "cluster", "scale", "security", "shared_directory", "description", "plan")
SCALE_KEYS = ("jobs", "n", "cores", "memory")
#: words of sbatch's refusals, and the profile key (a SLURMCluster argument) that sets what it refused
SBATCH_REFUSALS = {
    "partition": "queue",
    "account": "account",
    "qos": "job_extra_directives",
    "memory": "memory",
    "node configuration": "cores",
}
#: the scheduler of a profile serves its dashboard on loopback only (reach it by SSH tunnel)
DEFAULT_SCHEDULER_OPTIONS = {"dashboard_address": "127.0.0.1:8787"}

# schemes that carry data unauthenticated and unencrypted
_PLAINTEXT_SCHEMES = ("tcp", "ws", "ucx")
_SCHEMES = (*_PLAINTEXT_SCHEMES, "tls", "wss", "inproc")


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_address(address: str, *, security: Security | None = None, insecure: bool = False) -> str:
    """Validate a scheduler address and return it with its protocol.

    ``host:port`` without a protocol means ``tcp://host:port``, as in Dask.
    A plain-text protocol (tcp, ws, ucx) to a host that is not loopback is
    refused unless ``insecure=True``, and logged as a warning when accepted.
    """
    if not isinstance(address, str) or not address.strip():
        raise invalid("address", address, "a scheduler address such as 'tcp://127.0.0.1:8786' or 'tls://host:8786'")
    if "://" not in address:
        address = "tcp://" + address
    parsed = urlparse(address)
    if parsed.scheme not in _SCHEMES:
        raise invalid("address", address, "an address with protocol " + ", ".join(f"{s}://" for s in _SCHEMES))
    if parsed.scheme == "inproc":
        return address
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError:  # port out of range or not a number
        host, port = None, None
    if not host or port is None:
        raise invalid("address", address, "protocol://host:port, e.g. 'tls://10.0.0.5:8786'")
    if security is not None and not isinstance(security, Security):
        raise invalid("security", type(security).__name__, "a distributed.security.Security or None", TypeError)
    if parsed.scheme in _PLAINTEXT_SCHEMES and not _is_loopback(host):
        if not insecure:
            raise invalid(
                "address",
                address,
                "a loopback address, or tls:// with a Security object for a remote scheduler "
                "(pass insecure=True to accept an unauthenticated, unencrypted remote connection)",
            )
        logger.warning("Connecting to %s without TLS: traffic is unauthenticated and unencrypted", address)
    return address


def _worker_config() -> dict[str, str]:
    """Dask settings of the workers daskann starts (dotted keys): the profiler's sampling interval.

    From ``daskann.cluster.worker-profile-interval``; empty when that is null,
    so that Dask's own ``distributed.worker.profile.interval`` applies.
    """
    key = "cluster.worker-profile-interval"
    if config.get(key) is None:
        return {}
    seconds = config.seconds(key)
    if not seconds > 0:
        raise invalid(f"daskann.{key}", config.get(key), "a positive duration such as '100ms', or null")
    return {"distributed.worker.profile.interval": f"{seconds * 1000:g}ms"}


def _worker_environ() -> dict[str, str]:
    """Dask's pre-spawn environment (memory trimming, ...) with every BLAS on one thread, one malloc arena."""
    base = dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}
    return {**{k: str(v) for k, v in base.items()}, **WORKER_ENVIRON}


def local_cluster(
    n_workers: int | None = None,
    *,
    threads_per_worker: int = 1,
    memory_limit="auto",
    dashboard: bool = True,
    security: Security | bool | None = None,
    **kwargs,
) -> LocalCluster:
    """Embedded process-worker cluster bound to 127.0.0.1, BLAS on one thread.

    Parameters
    ----------
    n_workers : int, optional
        Worker processes (default: one per core divided by ``threads_per_worker``).
    threads_per_worker : int
        Threads of each worker; BLAS stays on one thread regardless.
    memory_limit : str or int
        Per-worker memory limit, as in :class:`distributed.LocalCluster`.
    dashboard : bool
        Serve the dashboard pages on a free port of 127.0.0.1 (the scheduler's
        HTTP endpoints, such as ``/health``, are on that port either way).
    security : Security or bool, optional
        ``True`` for a temporary self-signed TLS setup (``tls://127.0.0.1``).
    **kwargs
        Passed to :class:`distributed.LocalCluster` (not ``host`` nor ``processes``).
        ``config``, Dask settings for the workers, is added to daskann's own.

    Notes
    -----
    The workers sample their threads for the dashboard's Profile page every
    ``daskann.cluster.worker-profile-interval`` (100 ms; Dask's default is 10 ms).
    """
    _refuse_fixed_options(kwargs)
    threads_per_worker = check_int("threads_per_worker", threads_per_worker)
    n_workers = check_int("n_workers", n_workers if n_workers is not None else _default_workers(threads_per_worker))
    # each nanny hands its worker this configuration (workers added later by scale() too)
    worker_config = {**_worker_config(), **(kwargs.pop("config", None) or {})}
    # Nannies read the pre-spawn environment when created, i.e. inside LocalCluster(...);
    # BLAS reads it when loaded, which may be before Worker code runs, hence pre-spawn.
    environ = _worker_environ()
    # The scheduler's HTTP server (health, metrics) runs even without a dashboard, on 8787 by
    # default: keep it on a free loopback port and only add the dashboard pages when asked.
    scheduler_kwargs = {"dashboard": bool(dashboard), **(kwargs.pop("scheduler_kwargs", None) or {})}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        cluster = LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads_per_worker,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs=scheduler_kwargs,
            memory_limit=memory_limit,
            security=security,
            # also in the worker spec, so workers added later by scale() keep one BLAS thread
            env=dict(WORKER_ENVIRON),
            config=worker_config,
            **kwargs,
        )
    return cluster


def _refuse_fixed_options(kwargs: dict) -> None:
    """Refuse the :class:`distributed.LocalCluster` options the embedded cluster sets itself."""
    for fixed in ("host", "processes", "dashboard_address", "ip"):
        if fixed in kwargs:
            raise invalid(
                fixed, kwargs[fixed], "not set: daskann's embedded cluster is process-based on 127.0.0.1", TypeError
            )


def _default_workers(threads_per_worker: int) -> int:
    return max(1, (os.cpu_count() or 1) // threads_per_worker)


def _profile_dirs() -> list:
    """Folders searched for a profile name: ``DASKANN_PROFILE_DIR``'s, then the shipped one.

    The shipped folder is an :mod:`importlib.resources` traversable (a plain
    path unless daskann is imported from a zip file), so only its
    ``is_dir``/``iterdir``/``is_file``/``read_text`` are used.
    """
    extra = [Path(p).expanduser() for p in os.environ.get("DASKANN_PROFILE_DIR", "").split(os.pathsep) if p]
    return [*extra, PROFILE_DIR]


def available_profiles() -> list[str]:
    """Names of the profiles :func:`load_profile` finds by name."""
    return sorted(
        {
            p.name.removesuffix(".yaml")
            for d in _profile_dirs()
            if d.is_dir()
            for p in d.iterdir()
            if p.name.endswith(".yaml") and p.is_file()
        }
    )


def _profile_path(profile):
    if not isinstance(profile, (str, os.PathLike)) or not str(profile):
        raise invalid("profile", profile, "a profile name or a path to a YAML file", TypeError)
    path = Path(profile).expanduser()
    if path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        if path.is_file():
            return path
    else:
        for folder in _profile_dirs():
            candidate = folder / f"{profile}.yaml"
            if candidate.is_file():
                return candidate
    available = available_profiles()
    raise invalid(
        "profile",
        str(profile),
        "an existing YAML file or one of "
        + (", ".join(map(repr, available)) or "(no profiles found)")
        + f" (searched {', '.join(str(d) for d in _profile_dirs())})",
        FileNotFoundError,
    )


def load_profile(profile: str | os.PathLike) -> dict:
    """Read a jobqueue profile.

    A profile is a YAML mapping::

        kind: slurm            # or pbs
        security: true         # TLS with a temporary certificate (default: false)
        shared_directory: /shared/me/daskann   # a folder every node sees (optional)
        cluster: {...}         # keyword arguments of SLURMCluster / PBSCluster
        scale: {jobs: 2}       # the jobs (or workers, cores, memory) the cluster keeps

    Parameters
    ----------
    profile : str or path
        A name (``"slurm"`` finds the shipped ``daskann/profiles/slurm.yaml``;
        folders listed in the ``DASKANN_PROFILE_DIR`` environment variable are
        searched first) or a path to a ``.yaml`` file.

    Returns
    -------
    dict
        ``kind``, ``cluster``, ``scale``, ``security``, ``shared_directory`` (a checked
        :class:`~pathlib.Path` or None) and ``path``.
    """
    path = _profile_path(profile)
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise invalid("profile", str(path), f"valid YAML ({exc})") from exc
    spec = {} if spec is None else spec
    if not isinstance(spec, Mapping):
        raise invalid(f"profile {path}", type(spec).__name__, "a YAML mapping with kind, cluster and scale")
    unknown = sorted(set(spec) - set(PROFILE_KEYS))
    if unknown:
        raise invalid(f"keys of {path}", unknown, "only " + ", ".join(PROFILE_KEYS))
    kind = spec.get("kind")
    if kind not in JOBQUEUE_CLASSES:
        raise invalid(f"kind in {path}", kind, "one of " + ", ".join(map(repr, JOBQUEUE_CLASSES)))
    cluster = spec.get("cluster") or {}
    if not isinstance(cluster, Mapping):
        raise invalid(f"cluster in {path}", cluster, f"a mapping of {JOBQUEUE_CLASSES[kind]} keyword arguments")
    scale = spec.get("scale") or {}
    if not isinstance(scale, Mapping) or set(scale) - set(SCALE_KEYS):
        raise invalid(f"scale in {path}", scale, "a mapping with keys among " + ", ".join(SCALE_KEYS))
    security = spec.get("security", False)
    if not isinstance(security, bool):
        raise invalid(f"security in {path}", security, "true or false")
    shared = spec.get("shared_directory")
    shared = None if shared is None else check_shared_directory(shared, f"shared_directory in {path}")
    _check_lifetime(cluster, path)
    return {
        "kind": kind,
        "cluster": dict(cluster),
        "scale": dict(scale),
        "security": security,
        "shared_directory": shared,
        "path": path,
    }


def _check_lifetime(cluster: Mapping, where) -> None:
    """Refuse a worker ``--lifetime`` that is not shorter than the jobs' ``walltime``: the job would die first."""
    args = [str(a) for a in cluster.get("worker_extra_args") or []]
    lifetime = None
    for i, arg in enumerate(args):
        if arg == "--lifetime" and i + 1 < len(args):
            lifetime = args[i + 1]
        elif arg.startswith("--lifetime="):
            lifetime = arg.partition("=")[2]
    walltime = cluster.get("walltime")
    if lifetime is None or walltime is None:
        return
    try:
        life_s = float(dask.utils.parse_timedelta(lifetime, default="seconds"))
    except (KeyError, TypeError, ValueError):
        raise invalid(f"--lifetime in {where}", lifetime, "a duration such as '55m' or '3300s'") from None
    wall_s = walltime_seconds(walltime, name=f"walltime in {where}")
    if life_s >= wall_s:
        raise invalid(
            f"--lifetime in {where}",
            lifetime,
            f"shorter than the walltime {walltime!r} ({wall_s:g} s), so that workers retire before the batch "
            "system kills their jobs (a few minutes less, with --lifetime-stagger)",
        )


def walltime_seconds(walltime, *, name: str = "walltime") -> float:
    """Seconds of a batch walltime: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM`` or ``D-HH:MM:SS``."""
    text = str(walltime).strip()
    days, _, clock = text.rpartition("-")
    try:
        parts = [float(p) for p in clock.split(":")]
        day_s = 86400 * float(days) if days else 0.0
    except ValueError:
        parts = None
    if not parts or len(parts) > 3 or any(p < 0 for p in parts):
        raise invalid(name, walltime, "a walltime such as '01:00:00', '90' (minutes) or '1-12:00:00'")
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        parts += [0.0] * (3 - len(parts))
        return day_s + 3600 * parts[0] + 60 * parts[1] + parts[2]
    weights = {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(parts)]
    return float(sum(w * p for w, p in zip(weights, parts, strict=True)))


def _private_dir(path, name: str = "shared_temp_directory") -> str:
    """Create (or tighten) a folder only its owner can read: it holds TLS keys."""
    folder = Path(os.path.expandvars(str(path))).expanduser().absolute()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise invalid(name, str(folder), "a folder owned by the current user (it will hold TLS keys)", PermissionError)
    if stat.S_IMODE(info.st_mode) & 0o077:
        logger.warning("Restricting %s to its owner (mode 0700): it holds TLS keys", folder)
        folder.chmod(0o700)
    return str(folder)


def check_shared_directory(path, name: str = "shared_directory") -> Path:
    """An existing, writable folder that every node sees, as an absolute path (``~`` and ``$VARS`` expanded)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise invalid(name, path, "a path to an existing folder that every node sees", TypeError)
    folder = Path(os.path.expandvars(str(path))).expanduser().absolute()
    if not folder.is_dir():
        raise invalid(name, str(folder), "an existing folder that every node sees (create it first)", FileNotFoundError)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise invalid(name, str(folder), "a folder this user can write to", PermissionError)
    return folder


def shared_directory(c: Client | None = None) -> Path | None:
    """The folder every node of ``c``'s cluster sees, or ``None`` where none is set.

    A profile's ``shared_directory`` for a client of a cluster started from it
    (:func:`client` or :func:`jobqueue_cluster`), else the setting
    ``daskann.cluster.shared-directory``. Methods keep there what workers on other
    nodes must read (MGRIT's trajectories when no store is given).
    """
    folder = getattr(getattr(c, "cluster", None), "_daskann_shared_directory", None)
    if folder is not None:
        return folder
    setting = config.get("cluster.shared-directory")
    return None if setting is None else check_shared_directory(setting, "daskann.cluster.shared-directory")


def _check_dashboard(address) -> None:
    host = str(address or "").rpartition(":")[0].strip("[]")
    if address is not None and host in ("", "0.0.0.0", "::"):
        logger.warning(
            "The scheduler dashboard %r listens on every interface; anyone on the network can read it. "
            "Use '127.0.0.1:8787' and an SSH tunnel instead.",
            address,
        )


def jobqueue_cluster(profile: str | os.PathLike, *, security: Security | bool | None = None, **overrides):
    """Build (but do not scale) the dask-jobqueue cluster of a profile.

    Every worker process runs one thread (``processes`` equals ``cores``) and
    one BLAS thread. With TLS (``security: true`` in the profile, or the
    ``security`` argument), the temporary key and certificates the jobs read
    are written to ``shared_temp_directory`` (default: the dask config value
    ``daskann.cluster.tls-directory``, ``~/.daskann/tls``), a folder made
    private (0700); it must be visible from the compute nodes.

    Parameters
    ----------
    profile : str or path
        See :func:`load_profile`.
    security : Security or bool, optional
        Overrides the profile's ``security``.
    **overrides
        Keyword arguments of the jobqueue class, over the profile's ``cluster``;
        ``scheduler_options`` is merged key by key.

    Returns
    -------
    (cluster, scale)
        The started (but empty) cluster and the profile's ``scale`` arguments.
    """
    try:
        import dask_jobqueue
    except ImportError as exc:  # optional extra
        raise ImportError("profiles need dask-jobqueue: pip install 'daskann[hpc]'") from exc
    spec = load_profile(profile)
    where = spec["path"]
    options = {**spec["cluster"], **overrides}
    _check_one_thread_per_process(options, where)
    scheduler_options = {
        **DEFAULT_SCHEDULER_OPTIONS,
        **(spec["cluster"].get("scheduler_options") or {}),
        **(overrides.get("scheduler_options") or {}),
    }
    _check_dashboard(scheduler_options.get("dashboard_address"))
    options["scheduler_options"] = scheduler_options
    shared = spec["shared_directory"] or shared_directory()
    _set_security(options, security, spec["security"], shared)
    options["job_script_prologue"] = _job_prologue(options.pop("job_script_prologue", None) or [])
    cls = getattr(dask_jobqueue, JOBQUEUE_CLASSES[spec["kind"]])
    cluster = cls(**options)
    cluster._daskann_shared_directory = spec["shared_directory"]
    cluster._daskann_profile = spec
    return cluster, spec["scale"]


def check_submission(cluster) -> None:
    """Ask SLURM whether it would take the profile's job (``sbatch --test-only``), before any job is queued.

    An unknown partition or account otherwise fails in the background, job after job, while the run
    waits for workers that never come. Other batch systems have no dry run: their jobs are not checked.
    """
    spec = getattr(cluster, "_daskann_profile", None)
    if spec is None or spec["kind"] != "slurm" or shutil.which("sbatch") is None:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="daskann-check-") as script:
        script.write(cluster.job_script())
        script.flush()
        done = subprocess.run(["sbatch", "--test-only", script.name], capture_output=True, text=True, timeout=60)
    if done.returncode == 0:
        return
    message = next((line for line in done.stderr.splitlines() if "error" in line.lower()), done.stderr.strip())
    lowered = message.lower()
    key = next((k for word, k in SBATCH_REFUSALS.items() if word in lowered), "cluster")
    value = spec["cluster"].get(key) if key != "cluster" else None
    raise invalid(
        f"{key} in {spec['path']}", value, f"a job sbatch accepts (sbatch --test-only said: {message.strip()})"
    )


def _check_one_thread_per_process(options: dict, where) -> None:
    """Refuse a profile whose jobs run other than one worker process per core (``processes`` defaults to ``cores``)."""
    cores = options.get("cores")
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise invalid(f"cores in {where}", cores, "a positive integer: worker processes per job")
    processes = options.setdefault("processes", cores)
    if processes != cores:
        raise invalid(
            f"processes in {where}", processes, f"equal to cores ({cores}): daskann runs one thread per worker process"
        )


def _set_security(options: dict, security, profile_security: bool, shared: Path | None = None) -> None:
    """TLS options of a jobqueue cluster: ``security`` (else the options', else the profile's) and its key folder.

    The keys go to the cluster's ``shared_temp_directory``, else a private folder in the
    ``shared`` directory, else ``daskann.cluster.tls-directory``.
    """
    if security is None:
        security = options.pop("security", None) or profile_security or None
    else:
        options.pop("security", None)
    if security:
        default = shared / "daskann-tls" if shared is not None else config.get("cluster.tls-directory")
        options["shared_temp_directory"] = _private_dir(options.get("shared_temp_directory") or default)
        options["security"] = security
    elif "shared_temp_directory" in options:
        options["shared_temp_directory"] = str(Path(os.path.expandvars(options["shared_temp_directory"])).expanduser())


def _job_prologue(lines) -> list[str]:
    """A job script's prologue with the worker environment daskann sets, as on the embedded cluster.

    One BLAS thread each and one malloc arena, then daskann's Dask settings as environment
    variables (``DASK_DISTRIBUTED__WORKER__...``), read by the job's nanny.
    """
    prologue = [str(line) for line in lines]
    prologue += [f"export {k}={v}" for k, v in WORKER_ENVIRON.items()]
    for key, value in _worker_config().items():
        prologue.append(f"export DASK_{key.upper().replace('.', '__').replace('-', '_')}={value}")
    return prologue


def client(
    address: str | None = None,
    *,
    profile: str | os.PathLike | None = None,
    n_workers: int | None = None,
    threads_per_worker: int = 1,
    security: Security | bool | None = None,
    insecure: bool = False,
    timeout: float | None = None,
    dashboard: bool = True,
    quiet: bool = False,
) -> Client:
    """A client on an embedded cluster, an existing scheduler, or a jobqueue profile.

    Parameters
    ----------
    address : str, optional
        Scheduler to connect to. The wait is bounded by ``timeout``.
    profile : str or path, optional
        Name of a shipped profile (``"slurm"``, ``"pbs"``) or a YAML path.
    n_workers : int, optional
        Workers of the embedded cluster (default: one per core), or jobs to start for a profile
        (default: the profile's ``scale``).
    threads_per_worker : int
        Threads per embedded worker; 1 keeps results reproducible.
    security : distributed.security.Security or bool, optional
        TLS credentials for ``tls://`` addresses; for an embedded cluster or a profile, ``True``
        means a temporary self-signed certificate.
    insecure : bool
        Accept a plain ``tcp://`` address that is not loopback.
    timeout : float, optional
        Seconds to wait for a scheduler (default: the dask config value
        ``daskann.cluster.connect-timeout``, 10 s).
    dashboard : bool
        Serve the dashboard (on 127.0.0.1 for embedded clusters).
    quiet : bool
        Do not log the dashboard link (logged at INFO on the ``daskann.cluster`` logger).

    Returns
    -------
    distributed.Client
        Close it with :func:`close`, which also closes any cluster this function started.

    Raises
    ------
    ConnectionError
        No scheduler at ``address`` answered within ``timeout`` seconds, or the TLS handshake failed.
    """
    if address is not None and profile is not None:
        raise invalid(OptionName(("address", "profile")), (address, profile), "one of address or profile, not both")
    timeout = config.seconds("cluster.connect-timeout") if timeout is None else timeout
    timeout = check_float("timeout", timeout, minimum=0.0, min_inclusive=False)
    if address is not None:
        c = _connect(address, security=security, insecure=insecure, timeout=timeout)
    else:
        c = _start_cluster(profile, n_workers, threads_per_worker, security, dashboard, timeout)
    if not quiet and dashboard:
        log_dashboard(c)
    return c


def _connect(address: str, *, security, insecure: bool, timeout: float) -> Client:
    """A client of the scheduler at ``address``, checked first (TLS, or loopback unless ``insecure``)."""
    if isinstance(security, bool):
        raise invalid("security", security, "a Security object (or None) when connecting to an address", TypeError)
    address = check_address(address, security=security, insecure=insecure)
    try:
        return Client(address, security=security, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        raise named_error(
            ConnectionError,
            "address",
            f"{address!r}: could not connect to a Dask scheduler within {timeout:g} s ({type(exc).__name__}: {exc})",
        ) from exc


def _start_cluster(profile, n_workers, threads_per_worker: int, security, dashboard: bool, timeout: float) -> Client:
    """A client of a cluster it starts (a profile's, else an embedded one); :func:`close` closes both.

    A profile's cluster keeps its jobs (:func:`keep_jobs`) and the client is returned once its
    workers are connected, waiting up to ``daskann.cluster.worker-wait`` for queued jobs.
    """
    if profile is None:
        cluster = local_cluster(
            n_workers, threads_per_worker=threads_per_worker, dashboard=dashboard, security=security
        )
        try:
            c = Client(cluster, timeout=timeout)
        except BaseException:
            cluster.close()
            raise
        c._daskann_owns_cluster = True
        return c
    cluster, scale = jobqueue_cluster(profile, security=security)
    if n_workers is not None:
        scale = {"jobs": check_int("n_workers", n_workers)}
    c = None
    try:
        check_submission(cluster)
        keep_jobs(cluster, scale)
        c = Client(cluster, timeout=timeout)
        c._daskann_owns_cluster = True
        if scale:  # a profile that asks for no jobs has no workers to wait for
            _batch.wait_for_workers(c, report=_report_to_stderr)
    except BaseException:
        if c is not None:
            close(c)
        else:
            _close_cluster(cluster)
        raise
    return c


def keep_jobs(cluster, scale: Mapping | None) -> None:
    """Keep a jobqueue cluster at the size ``scale`` names for its whole life, replacing jobs that end.

    ``scale`` is a profile's: ``{"jobs": n}``, ``{"n": workers}``, ``{"cores": c}`` or
    ``{"memory": "64GB"}``. A job ends whole on a batch system (walltime, ``scancel``, a failed
    node) and a fixed ``cluster.scale`` does not replace workers that retired at ``--lifetime``:
    dask-jobqueue's ``adapt`` with equal bounds submits a new job for each one that ends.
    """
    scale = dict(scale or {})
    if not scale:
        return
    bounds = {
        "jobs": ("minimum_jobs", "maximum_jobs"),
        "n": ("minimum", "maximum"),
        "cores": ("minimum_cores", "maximum_cores"),
        "memory": ("minimum_memory", "maximum_memory"),
    }
    (key, value), *rest = scale.items()
    if rest or key not in bounds:
        raise invalid("scale", scale, "one of " + ", ".join(f"{{{k}: ...}}" for k in bounds))
    low, high = bounds[key]
    cluster.scale(**scale)  # submits the jobs now; adapt keeps their number from then on
    cluster.adapt(**{low: value, high: value})


def _report_to_stderr(line: str) -> None:
    print(f"daskann: waiting for workers: {line}", file=sys.stderr, flush=True)


def log_dashboard(c: Client, level: int = logging.INFO) -> str | None:
    """Log (and return) the dashboard link of ``c``'s scheduler, if it serves one."""
    try:
        link = c.dashboard_link
    except Exception:  # no dashboard, or the scheduler did not say
        link = None
    if link:
        logger.log(level, "Dask dashboard: %s", link)
    return link


def close(c: Client) -> None:
    """Close a client and, if :func:`client` started it, its cluster."""
    cluster = c.cluster if getattr(c, "_daskann_owns_cluster", False) else None
    c.close()
    if cluster is not None:
        _close_cluster(cluster)


def _close_cluster(cluster) -> None:
    """Close a cluster this module started, with the TLS key files of a jobqueue one."""
    cluster.close()
    # dask-jobqueue keeps the workers' TLS keys in open temporary files in the shared folder for as long as
    # the cluster object lives: remove them with the cluster rather than whenever it is collected
    for name, value in list(vars(cluster).items()):
        if name.startswith("_job_") and hasattr(value, "close"):
            value.close()


@contextlib.contextmanager
def resolve_client(c: Client | None = None, *, n_workers: int | None = None, verbose: bool = False):
    """The given client, the current default one, or a temporary embedded cluster.

    Trainers use this for ``client=None``: the embedded cluster is closed on
    exit. The dashboard link is logged as the run starts. A batch cluster whose
    worker jobs are still queued is waited for (``daskann.cluster.worker-wait``),
    reporting the jobs on stderr when ``verbose``.
    """
    if c is not None and not isinstance(c, Client):
        raise invalid("client", type(c).__name__, "a distributed.Client or None", TypeError)
    given = c if c is not None else current_sync_client()
    if given is not None:
        log_dashboard(given, logging.INFO)
        if _batch.is_batch_cluster(getattr(given, "cluster", None)) and _batch.pending(given):
            _batch.wait_for_workers(given, report=_report_to_stderr if verbose else None)
        yield given
        return
    if in_worker_task():
        # a fit inside a task (dask-ml's Incremental, a search) cannot start a cluster in a worker process
        raise invalid(
            "client",
            None,
            "a distributed.Client: inside a task on a Dask worker a parallel trainer cannot start a cluster of its "
            "own (SerialTrainer needs none)",
        )
    owned = client(n_workers=n_workers)
    try:
        yield owned
    finally:
        close(owned)


def current_sync_client() -> Client | None:
    """The default client, unless there is none or it is asynchronous here (in its own event loop).

    Code that waits for results cannot use an asynchronous client, such as the one a
    coroutine of dask-ml's searches runs under: it is left alone rather than taken by accident.
    """
    try:
        current = default_client()
    except ValueError:
        return None
    return None if current.asynchronous else current


def in_worker_task() -> bool:
    """Whether this code runs inside a task on a Dask worker."""
    try:
        get_worker()
    except ValueError:
        return False
    return True


def worker_addresses(c: Client) -> list[str]:
    """Addresses of the client's workers, sorted by worker name for a stable order.

    Asks the scheduler itself: the client's cached ``scheduler_info`` can be
    refreshed in the background with a copy that lists no workers. Workers that
    are leaving (a batch job's worker retiring before its walltime) are left out.
    """
    return [addr for addr, _ in sorted(_batch.connected(c).items(), key=lambda kv: (kv[1], kv[0]))]


def workers_left(c: Client, workers, *, listed=worker_addresses) -> list[str]:
    """Those of ``workers`` (in their order) that ``listed(c)``, the scheduler's workers now, does not name."""
    alive = set(listed(c))
    return [w for w in workers if w not in alive]


def wait_watching(futures, look, *, poll: float | None = None, watch=None):
    """The first answer of ``look()`` other than None: asked at once, whenever one of ``futures``
    completes, and at least every ``poll`` seconds (the setting ``npt.poll-interval``, read at each
    wait, when None).

    The wait on tasks pinned to workers that may leave, which would otherwise hang: ``look`` answers
    once the futures are done (with their results, or True), and raises the caller's own error when
    one of the workers it watches has left (:func:`workers_left`) or a task failed. ``watch()``, when
    given, runs each time ``poll`` seconds pass with no future completing: a check that asks the
    scheduler (which workers are left) belongs there, off the path of every completion.
    """
    wake = threading.Event()
    for future in futures:
        future.add_done_callback(lambda _: wake.set())
    while True:
        wake.clear()
        answer = look()
        if answer is not None:
            return answer
        woken = wake.wait(config.seconds("npt.poll-interval") if poll is None else poll)
        if not woken and watch is not None:
            watch()


def result_within(future, timeout: float):
    """``future.result()``, after waiting at most ``timeout`` seconds for its task to finish.

    Only the wait is timed, never the transfer of the result. distributed's
    ``future.result(timeout=...)`` times both, and a timeout that fires before the
    transfer has started cancels the gather that the client shares among its callers:
    every later result of that client then fails (``UnboundLocalError`` in
    ``distributed.utils.sync``). A wait cancels nothing the client shares.

    Raises
    ------
    TimeoutError
        The task did not finish within ``timeout`` seconds.
    """
    if not future.done():  # a done callback runs on a thread of its own, a millisecond or so later
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout):
            raise TimeoutError(f"{future.key} did not finish within {timeout:g} s")
    return future.result()


def worker_threads(c: Client) -> dict[str, int]:
    """``{address: nthreads}`` of the client's workers, asked of the scheduler itself (see :func:`worker_addresses`)."""
    info = c.sync(c.scheduler.identity, n_workers=-1)["workers"]
    return {addr: int(w.get("nthreads", 1)) for addr, w in info.items()}


def check_worker_memory(c: Client, nbytes: int, *, name: str = "X", what: str = "training data") -> None:
    """Refuse a run whose ``nbytes`` per worker exceed a worker's memory limit, before any task.

    The nanny restarts a worker past ``distributed.worker.memory.terminate``
    (95% of ``memory_limit`` by default); a run that would put more than that
    on one worker can only end in ``KilledWorker``. Workers without a limit
    are not checked.
    """
    info = c.sync(c.scheduler.identity, n_workers=-1)["workers"]
    limits = [int(w["memory_limit"]) for w in info.values() if w.get("memory_limit")]
    if not limits:
        return
    fraction = dask.config.get("distributed.worker.memory.terminate", default=0.95) or 1.0
    budget = min(limits) * float(fraction)
    if nbytes > budget:
        raise invalid(
            name,
            f"{what} of {_mib(nbytes)} per worker",
            f"at most {_mib(budget)} per worker ({float(fraction):.0%} of the smallest worker memory_limit, "
            f"{_mib(min(limits))}): use more workers, workers with a larger memory_limit, or less data",
        )


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


@contextlib.contextmanager
def current_client(c: Client):
    """Make ``c`` the current client of this thread or task only.

    Futures deserialised inside attach to ``c`` and dask collections computed
    inside run on it. Unlike :meth:`distributed.Client.as_current`, this does
    not touch dask's global ``scheduler`` option, whose save-and-restore is not
    thread-safe: trainings run at once from several threads would leave it set
    to ``"dask.distributed"`` after every client is gone.
    """
    with set_current_client(c):
        yield c


BLAS_INFO_KEYS = ("internal_api", "num_threads", "architecture", "version", "threading_layer")


def _blas_info(keys=BLAS_INFO_KEYS) -> list[dict]:
    return [{k: lib.get(k) for k in keys} for lib in threadpool_info() if lib.get("user_api") == "blas"]


def blas_info(c: Client, *, keys=BLAS_INFO_KEYS, workers=None) -> dict[str, list[dict]]:
    """BLAS libraries each worker has loaded, as threadpoolctl reports them.

    Parameters
    ----------
    c : Client
    keys : sequence of str
        threadpoolctl's fields to report, in this order (a missing one is ``None``).
    workers : list of str, optional
        Only these workers (all by default).

    Returns
    -------
    dict
        Worker address to a list (usually one entry) of dicts with
        ``internal_api`` (openblas, mkl, ...), ``num_threads``,
        ``architecture`` (the kernel, e.g. Haswell, SkylakeX), ``version``
        and ``threading_layer``.
    """
    return c.run(_blas_info, keys, workers=workers)


__all__ = [
    "BLAS_ONE_THREAD",
    "WORKER_ENVIRON",
    "available_profiles",
    "blas_info",
    "check_address",
    "check_shared_directory",
    "check_worker_memory",
    "client",
    "close",
    "current_client",
    "jobqueue_cluster",
    "load_profile",
    "local_cluster",
    "log_dashboard",
    "resolve_client",
    "shared_directory",
    "worker_addresses",
    "worker_threads",
]
