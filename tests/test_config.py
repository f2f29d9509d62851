"""daskann's settings in dask.config: shipped defaults, overrides at call time, nothing written unasked."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib import resources

import dask
import pytest
import yaml

from daskann import config
from daskann.cluster import client

# every setting the package reads, with its shipped default in seconds or as a count
SECONDS = {
    "cluster.connect-timeout": 10.0,
    "cluster.worker-profile-interval": 0.1,
    "npt.poll-interval": 0.5,
    "npt.settle-time": 3.0,
    "npt.regrid-timeout": 30.0,
    "npt.close-timeout": 5.0,
    "store.lock-write-grace": 10.0,
}
COUNTS = {
    "npt.graph-replays": 2,
    "npt.resident-restarts": 2,
    "mgrit.context-attempts": 3,
    "partition.lost-data-reruns": 2,
}


def _python(code: str, *args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=full_env, cwd=cwd
    )


def test_shipped_defaults_are_registered():
    shipped = yaml.safe_load((resources.files("daskann") / "daskann.yaml").read_text(encoding="utf-8"))
    assert set(shipped) == {"daskann"}
    for key, value in SECONDS.items():
        assert config.seconds(key) == value, key
    for key, value in COUNTS.items():
        assert config.count(key) == value, key
    assert config.get("cluster.tls-directory") == "~/.daskann/tls"
    assert dask.config.get("daskann.npt.poll-interval") == "500ms"


def test_dask_config_set_is_seen_at_call_time():
    with dask.config.set({"daskann.npt.poll-interval": "2s", "daskann.npt.graph-replays": 5}):
        assert config.seconds("npt.poll-interval") == 2.0
        assert config.count("npt.graph-replays") == 5
    assert config.seconds("npt.poll-interval") == 0.5
    with dask.config.set({"daskann.mgrit.context-attempts": -1}):
        with pytest.raises(ValueError, match=r"daskann.mgrit.context-attempts=-1 is not valid"):
            config.count("mgrit.context-attempts")
    with dask.config.set({"daskann.npt.poll-interval": "soon"}):
        with pytest.raises(ValueError, match=r"daskann.npt.poll-interval='soon' is not valid: expected a duration"):
            config.seconds("npt.poll-interval")


def test_connect_timeout_setting_bounds_the_wait():
    """client(address) without timeout= reads daskann.cluster.connect-timeout when called."""
    start = time.monotonic()
    with dask.config.set({"daskann.cluster.connect-timeout": "1.5s"}):
        with pytest.raises(ConnectionError, match=r"within 1.5 s"):
            client("tcp://127.0.0.1:1", quiet=True)
    assert time.monotonic() - start < 10


def test_environment_override_and_dask_config_get(tmp_path):
    """DASK_DASKANN__... reaches the settings; `dask config get daskann` lists them."""
    env = {
        "DASK_DASKANN__NPT__POLL_INTERVAL": "2s",
        "DASK_DASKANN__PARTITION__LOST_DATA_RERUNS": "4",
        "DASK_CONFIG": str(tmp_path / "dask-config"),
    }
    seen = _python(
        "from daskann import config; print(config.seconds('npt.poll-interval'), "
        "config.count('partition.lost-data-reruns'))",
        env=env,
        cwd=tmp_path,
    )
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.split() == ["2.0", "4"]

    # the dask command line, which loads the dask_cli entry point (daskann.cli) after dask: as the `dask`
    # executable runs it, and in a program that imported daskann before dask
    for code in ("import dask.cli; dask.cli.run_cli()", "import daskann, dask.cli; dask.cli.run_cli()"):
        listed = _python(code, "config", "get", "daskann", env=env, cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        settings = yaml.safe_load(listed.stdout)
        assert settings["npt"]["poll_interval"] == "2s"  # the environment's spelling wins
        assert settings["npt"]["settle-time"] == "3s" and settings["cluster"]["tls-directory"] == "~/.daskann/tls"
    assert not (tmp_path / "dask-config").exists()  # importing daskann writes no file


def test_ensure_file_only_when_asked(tmp_path):
    target = tmp_path / "dask"
    path = config.ensure_file(str(target))
    assert path == str(target / "daskann.yaml")
    text = (target / "daskann.yaml").read_text()
    assert "# daskann:" in text and "#     poll-interval: 500ms" in text
    assert yaml.safe_load(text) is None  # every value commented out: the file documents, it pins nothing
    (target / "daskann.yaml").write_text("daskann: {npt: {settle-time: 1s}}\n")
    config.ensure_file(str(target))  # an existing file is left alone
    assert "settle-time: 1s" in (target / "daskann.yaml").read_text()
