"""daskann.cluster on real processes: job scripts, listeners, BLAS threads, TLS, addresses."""

from __future__ import annotations

import logging
import operator
import os
import stat
import time
from importlib import resources
from pathlib import Path

import dask
import numpy as np
import psutil
import pytest
from distributed import Client

from daskann.cluster import (
    PROFILE_DIR,
    WORKER_ENVIRON,
    available_profiles,
    blas_info,
    check_address,
    client,
    close,
    jobqueue_cluster,
    load_profile,
    local_cluster,
    resolve_client,
    worker_addresses,
)

# the documented copy of the shipped profiles, in the repository
DOCUMENTED_PROFILES = Path(__file__).resolve().parent.parent / "cluster"
# worker jobs retire a few minutes before the walltime (01:00:00 in both shipped profiles)
LIFETIME_ARGS = "--lifetime 55m --lifetime-stagger 4m"
# the scheduler a profile test starts (the job script embeds its address) stays on loopback
LOOPBACK_SCHEDULER = {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}
WILDCARD = ("0.0.0.0", "::", "")


def _needs_jobqueue():
    pytest.importorskip("dask_jobqueue", reason="profiles need the hpc extra (dask-jobqueue)")


def _needs_tls():
    pytest.importorskip("cryptography", reason="Security.temporary() needs cryptography")


def _listeners(pids) -> list[tuple[int, str, int]]:
    """(pid, ip, port) of every listening inet socket of the given processes."""
    found = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        found += [(pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1].split("/")[0])


# ---------------------------------------------------------------- profiles and job scripts


@pytest.mark.parametrize(
    "name, directives",
    [
        ("slurm", ["#SBATCH --cpus-per-task=8", "#SBATCH --mem=30G", "#SBATCH -t 01:00:00"]),
        ("pbs", ["#PBS -l select=1:ncpus=8:mem=30GB", "#PBS -l walltime=01:00:00"]),
    ],
)
def test_shipped_profile_job_script(name, directives, tmp_path):
    _needs_jobqueue()
    _needs_tls()
    spec = load_profile(name)
    assert spec["kind"] == name and spec["security"] is True
    assert spec["cluster"]["scheduler_options"]["dashboard_address"].startswith("127.0.0.1:")
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir(mode=0o755)
    tls_dir.chmod(0o755)  # too open: daskann must tighten it before keys go in
    cluster, scale = jobqueue_cluster(name, shared_temp_directory=str(tls_dir), scheduler_options=LOOPBACK_SCHEDULER)
    try:
        script = cluster.job_script()
        assert scale == {"jobs": 2}
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        for line in directives:
            assert line in script.splitlines(), script
        for var in WORKER_ENVIRON:
            assert f"export {var}=1" in script.splitlines(), script
        command = script.strip().splitlines()[-1]
        assert "-m distributed.cli.dask_worker tls://127.0.0.1:" in command
        assert "--nthreads 1 " in command and "--nworkers 8 " in command and "--nanny" in command
        assert "--local-directory ${TMPDIR:-/tmp}" in command
        assert LIFETIME_ARGS in command and "--lifetime-restart" not in command
        # temporary TLS credentials, written into the private folder
        assert stat.S_IMODE(tls_dir.stat().st_mode) == 0o700
        for flag in ("--tls-ca-file", "--tls-cert", "--tls-key"):
            path = command.split(flag + " ", 1)[1].split()[0]
            assert os.path.dirname(path) == str(tls_dir)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        cluster.close()


def test_custom_profile_one_thread_per_process(tmp_path):
    _needs_jobqueue()
    profile = tmp_path / "site.yaml"
    profile.write_text(
        "kind: slurm\n"
        "cluster:\n"
        "  cores: 4\n  memory: 8GB\n  queue: short\n  account: proj42\n  walltime: '00:10:00'\n"
        "  job_extra_directives: ['--constraint=skylake']\n"
        "  job_script_prologue: ['module load python']\n"
        "scale: {jobs: 3}\n"
    )
    cluster, scale = jobqueue_cluster(profile, scheduler_options=LOOPBACK_SCHEDULER)
    try:
        script = cluster.job_script()
        lines = script.splitlines()
        assert scale == {"jobs": 3}
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")  # no TLS asked for
        for line in (
            "#SBATCH -p short",
            "#SBATCH -A proj42",
            "#SBATCH --cpus-per-task=4",
            "#SBATCH --constraint=skylake",
            "module load python",
            "export OPENBLAS_NUM_THREADS=1",
        ):
            assert line in lines, script
        assert lines.index("module load python") < lines.index("export OMP_NUM_THREADS=1")
        assert "--nthreads 1 " in lines[-1] and "--nworkers 4 " in lines[-1] and "--tls" not in script
    finally:
        cluster.close()

    with pytest.raises(ValueError, match=r"processes in .*site\.yaml=2 is not valid: expected equal to cores \(4\)"):
        jobqueue_cluster(profile, processes=2)


def test_client_from_tls_profile(tmp_path):
    """client(profile=...) end to end, without a batch system: no jobs asked for."""
    _needs_jobqueue()
    _needs_tls()
    profile = tmp_path / "tls.yaml"
    profile.write_text(
        "kind: pbs\nsecurity: true\n"
        f"cluster:\n  cores: 2\n  memory: 2GB\n  shared_temp_directory: {tmp_path / 'keys'}\n"
        "  scheduler_options: {host: 127.0.0.1, dashboard_address: '127.0.0.1:0'}\n"
        "scale: {}\n"
    )
    c = client(profile=profile, timeout=20)
    try:
        cluster = c.cluster
        assert type(cluster).__name__ == "PBSCluster"
        assert c.scheduler.address.startswith("tls://127.0.0.1:")  # the client speaks TLS with the cluster's keys
        assert c.scheduler_info()["workers"] == {}
        assert c.dashboard_link.startswith("http://127.0.0.1:")
        assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    finally:
        close(c)
    assert cluster.status.name == "closed"
    # the workers' keys do not outlive the cluster in the shared folder
    assert not list((tmp_path / "keys").glob(".dask-jobqueue.worker.*"))


def test_profiles_ship_as_package_data():
    """The wheel carries the profiles; cluster/ holds the same files for reading."""
    shipped = resources.files("daskann") / "profiles"
    assert Path(str(PROFILE_DIR)) == Path(str(shipped))
    assert Path(str(shipped)).resolve().parent == Path(resources.files("daskann").__fspath__()).resolve()
    names = sorted(p.name for p in shipped.iterdir() if p.name.endswith(".yaml"))
    assert names == ["pbs.yaml", "slurm.yaml"]
    assert sorted(p.name for p in DOCUMENTED_PROFILES.glob("*.yaml")) == names
    for name in names:
        assert (shipped / name).read_bytes() == (DOCUMENTED_PROFILES / name).read_bytes(), (
            f"daskann/profiles/{name} and cluster/{name} differ: edit one, copy it over the other"
        )
        spec = load_profile(name.removesuffix(".yaml"))
        assert spec["cluster"]["worker_extra_args"] == LIFETIME_ARGS.split()
        assert "interface: ib0" in (shipped / name).read_text()  # documented, left to the site


def test_profile_dir_environment_searched_first(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "mysite.yaml").write_text("kind: pbs\ncluster: {cores: 2, memory: 4GB}\n")
    (site / "slurm.yaml").write_text("kind: slurm\ncluster: {cores: 3, memory: 6GB}\n")
    monkeypatch.setenv("DASKANN_PROFILE_DIR", os.pathsep.join([str(tmp_path / "missing"), str(site)]))
    assert {"mysite", "pbs", "slurm"} <= set(available_profiles())
    assert load_profile("mysite")["kind"] == "pbs"
    assert load_profile("slurm")["cluster"]["cores"] == 3  # the site's copy shadows the shipped one
    assert load_profile("pbs")["path"] == PROFILE_DIR / "pbs.yaml"


def test_tls_directory_from_dask_config(tmp_path):
    """Without shared_temp_directory, the TLS folder is daskann.cluster.tls-directory, read when called."""
    _needs_jobqueue()
    _needs_tls()
    folder = tmp_path / "keys"
    with dask.config.set({"daskann.cluster.tls-directory": str(folder)}):
        cluster, _ = jobqueue_cluster("slurm", scheduler_options=LOOPBACK_SCHEDULER)
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert f"--tls-key {folder}{os.sep}" in cluster.job_script()
    finally:
        cluster.close()


def test_load_profile_errors(tmp_path):
    assert {"slurm", "pbs"} <= set(available_profiles())
    with pytest.raises(FileNotFoundError, match=r"profile='nosuch' is not valid: .*'pbs', 'slurm'"):
        load_profile("nosuch")
    with pytest.raises(FileNotFoundError, match=r"profile=.*missing\.yaml"):
        load_profile(tmp_path / "missing.yaml")

    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: lsf\ncluster: {cores: 1, memory: 1GB}\n")
    with pytest.raises(ValueError, match=r"kind in .*bad\.yaml='lsf' is not valid: expected one of 'slurm', 'pbs'"):
        load_profile(bad)
    bad.write_text("kind: slurm\nclustre: {cores: 1}\n")
    with pytest.raises(ValueError, match=r"keys of .*\['clustre'\]"):
        load_profile(bad)
    bad.write_text("kind: pbs\nscale: {workers: 2}\n")
    with pytest.raises(ValueError, match=r"scale in .*expected a mapping with keys among jobs, n"):
        load_profile(bad)
    bad.write_text("kind: pbs\nsecurity: 'yes'\n")
    with pytest.raises(ValueError, match=r"security in .*expected true or false"):
        load_profile(bad)


# ---------------------------------------------------------------- embedded cluster


class _Messages(logging.Handler):
    """Keeps the messages of one logger (LocalCluster's silence_logs lowers caplog's handler level)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[tuple[int, str]] = []

    def emit(self, record):
        self.messages.append((record.levelno, record.getMessage()))


def test_embedded_cluster_listens_on_loopback_only():
    logger = logging.getLogger("daskann.cluster")
    kept, previous = _Messages(), logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(kept)
    me = os.getpid()
    # the scheduler and nannies live in this process, beside other tests' clusters: compare
    before = set(_listeners([me]))
    try:
        c = client(n_workers=1)  # the default: dashboard on
    finally:
        logger.removeHandler(kept)
        logger.setLevel(previous)
    try:
        link = c.dashboard_link
        assert link.startswith("http://127.0.0.1:")
        assert (logging.INFO, f"Dask dashboard: {link}") in kept.messages  # logged at INFO, not printed
        worker_pids = list(c.run(os.getpid).values())
        ours = (set(_listeners([me])) - before) | set(_listeners(worker_pids))
        assert not [item for item in ours if item[1] in WILDCARD], ours
        assert {ip for _, ip, _ in ours} == {"127.0.0.1"}, ours
        # the scheduler, its dashboard, the nanny and the worker's own sockets were all looked at
        ports = {port for _, _, port in ours}
        assert {_port(c.scheduler.address), _port(link), *map(_port, c.nthreads())} <= ports
        assert len([item for item in ours if item[0] in worker_pids]) >= 2  # worker comm + its HTTP server

        assert c.nthreads() == {addr: 1 for addr in c.nthreads()}
        (libs,) = blas_info(c).values()
        assert libs and all(lib["num_threads"] == 1 for lib in libs), libs
    finally:
        close(c)
    assert c.status == "closed"


def test_session_cluster_workers_one_thread_and_blas(client2):
    assert set(client2.nthreads().values()) == {1}
    info = blas_info(client2)
    assert sorted(info) == sorted(worker_addresses(client2))
    for libs in info.values():
        assert libs, "numpy's BLAS is not loaded on the worker"
        for lib in libs:
            assert lib["num_threads"] == 1
            assert {"internal_api", "num_threads", "architecture"} <= set(lib)
            assert lib["internal_api"] in ("openblas", "mkl", "blis", "accelerate")
    # BLAS limits and one malloc arena added to Dask's own pre-spawn environment (memory trimming), not replacing it
    expected = {
        **{k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()},
        **WORKER_ENVIRON,
    }
    env = client2.run(lambda: {k: os.environ.get(k) for k in expected})
    assert all(v == expected for v in env.values()), env
    # the profiler samples at daskann's interval; Dask's other settings are the client's
    settings = client2.run(
        lambda dask_worker: (
            dask_worker.periodic_callbacks["profile"].callback_time,
            dask.config.get("distributed.comm.timeouts.connect"),
        )
    )
    assert set(settings.values()) == {(100.0, "30s")}, settings


def test_worker_profile_interval_setting(tmp_path):
    with dask.config.set({"daskann.cluster.worker-profile-interval": "soon"}):
        with pytest.raises(ValueError, match=r"daskann\.cluster\.worker-profile-interval='soon' is not valid"):
            local_cluster(1)
    _needs_jobqueue()
    profile = tmp_path / "site.yaml"
    profile.write_text("kind: slurm\ncluster: {cores: 1, memory: 1GB}\nscale: {jobs: 1}\n")
    for interval, line in (("250ms", "export DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL=250ms"), (None, None)):
        with dask.config.set({"daskann.cluster.worker-profile-interval": interval}):
            cluster, _ = jobqueue_cluster(profile, scheduler_options=LOOPBACK_SCHEDULER)
        try:
            exports = [x for x in cluster.job_script().splitlines() if "PROFILE__INTERVAL" in x]
            assert exports == ([line] if line else []), exports  # null: Dask's own setting
        finally:
            cluster.close()


def test_local_cluster_refuses_other_hosts():
    with pytest.raises(TypeError, match="host='0.0.0.0' is not valid"):
        local_cluster(1, host="0.0.0.0")


# ---------------------------------------------------------------- addresses


def test_unreachable_scheduler_fails_in_bounded_time():
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=r"address='tcp://127\.0\.0\.1:1'.*within 2 s"):
        client("tcp://127.0.0.1:1", timeout=2)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("address", ["tcp://10.1.2.3:8786", "192.168.0.7:8786", "ws://example.org:8786"])
def test_remote_plain_address_refused(address):
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"address='.*' is not valid: .*insecure=True"):
        client(address, timeout=30)
    assert time.monotonic() - start < 1  # refused before any connection attempt


def test_check_address(caplog):
    assert check_address("127.0.0.1:8786") == "tcp://127.0.0.1:8786"
    for ok in ("tcp://localhost:8786", "tcp://[::1]:8786", "tls://10.1.2.3:8786", "wss://host.example:443"):
        assert check_address(ok) == ok
    with caplog.at_level(logging.WARNING, logger="daskann.cluster"):
        assert check_address("tcp://10.1.2.3:8786", insecure=True) == "tcp://10.1.2.3:8786"
    assert "without TLS" in caplog.text
    for bad in ("http://127.0.0.1:8786", "tcp://127.0.0.1", "tcp://127.0.0.1:99999", "", None):
        with pytest.raises(ValueError, match="address="):
            check_address(bad)
    with pytest.raises(ValueError, match="address/profile"):
        client("tcp://127.0.0.1:1", profile="slurm")
    with pytest.raises(ValueError, match="timeout=0.0 is not valid"):
        client("tcp://127.0.0.1:1", timeout=0.0)


# ---------------------------------------------------------------- TLS


def test_tls_cluster_accepts_its_certificate_and_refuses_another():
    _needs_tls()
    from distributed.security import Security

    security = Security.temporary()
    cluster = local_cluster(1, dashboard=False, security=security, memory_limit="1GiB")
    try:
        address = cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:")
        c = client(address, security=security, timeout=20, quiet=True)
        try:
            assert c.submit(operator.add, 1, 2).result(timeout=30) == 3
        finally:
            close(c)

        start = time.monotonic()
        with pytest.raises(ConnectionError, match=rf"address='{address}'"):
            client(address, security=Security.temporary(), timeout=5, quiet=True)
        assert time.monotonic() - start < 15
    finally:
        cluster.close()


# ---------------------------------------------------------------- resolve_client


def test_resolve_client(client2):
    with resolve_client(client2) as c:
        assert c is client2
    assert client2.status == "running"  # a given client is left open
    with client2.as_current(), resolve_client() as c:
        assert c is client2
    with pytest.raises(TypeError, match="client='str' is not valid"):
        with resolve_client("tcp://127.0.0.1:8786"):
            pass
    assert isinstance(client2, Client)


def test_result_within_times_the_wait_for_a_result_not_its_transfer(client2):
    # future.result(timeout=...) also times the transfer of a finished result: a 1 ms timeout raises on
    # a 1.6 MB result from another process here, and one that fires before the transfer has started
    # cancels the gather the client shares, so every later result of that client fails. A client of its
    # own keeps such a failure from reaching the session's.
    from daskann.cluster import result_within

    with Client(client2.cluster, set_as_default=False) as c:
        for _ in range(20):
            future = c.submit(np.ones, 200_000, pure=False)
            while future.status != "finished":
                time.sleep(0.005)
            assert result_within(future, 0.001).shape == (200_000,)
        running = c.submit(time.sleep, 1, pure=False)
        with pytest.raises(TimeoutError, match="did not finish within 0.01 s"):
            result_within(running, 0.01)
        assert c.submit(sum, [1, 2], pure=False).result() == 3


class _RetiringPair:
    """A client of a batch cluster whose two workers retire at their walltime, then come back as new jobs.

    The scheduler lists the retiring pair (status ``closing_gracefully``) for its first ``looks`` answers,
    then their replacements under the same names and new addresses, as dask-jobqueue relaunches a job.
    """

    def __init__(self, looks: int):
        self.looks = looks
        self.scheduler = self
        self.cluster = type("SLURMLike", (), {"job_cls": None, "job_script": None, "plan": {"job-0", "job-1"}})()

    def identity(self, n_workers):
        self.looks -= 1
        if self.looks >= 0:
            return {"workers": {f"tls://old-{k}": {"name": f"job-{k}", "status": "closing_gracefully"} for k in (0, 1)}}
        return {"workers": {f"tls://new-{k}": {"name": f"job-{k}", "status": "running"} for k in (0, 1)}}

    def sync(self, func, **kwargs):
        return func(**kwargs)


def test_workers_retiring_at_their_walltime_are_waited_for_not_counted():
    from daskann import _batch

    c = _RetiringPair(looks=6)
    assert _batch.connected(c) == {} and _batch.pending(c) == {"job-0", "job-1"}
    assert worker_addresses(c) == []
    # a replay waits for the jobs that replace them, past the grace of a nanny's restart in place
    assert _batch.wait_for_replacements(c, 2, grace=0.0, timeout=60.0) == ["tls://new-0", "tls://new-1"]
