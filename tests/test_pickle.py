"""A trainer given ``client=c`` copies, hashes and pickles; a saved one outlives its cluster.

A client travels as a reference to its scheduler (``daskann/_client_reference.py``): in its own
process it is the same client, elsewhere the client of that process on the same scheduler, else
None. A fitted trainer's pickle holds its model and nothing of the cluster it trained on.
"""

from __future__ import annotations

import copy
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import dask.array as da
import joblib
import numpy as np
import pytest
from distributed import Client, Future
from sklearn.base import clone

import daskann
from daskann import MGRITTrainer, NPTTrainer, PartitionTrainer
from daskann._client_reference import resolve_client_reference
from daskann.cluster import local_cluster

# MGRIT fits here must run the solve, which the default policy skips for problems this small
pytestmark = pytest.mark.usefixtures("mgrit_study")

SETTINGS = dict(loss="cross_entropy", lr=0.1, batch_size=32, epochs=2, sgd={"momentum": 0.5})
#: one trainer of each parallel method and mode: name -> trainer on client ``c``
TRAINERS = {
    "npt-graph": lambda c: NPTTrainer((8,), grid="1x2", mode="graph", client=c, **SETTINGS),
    "npt-resident": lambda c: NPTTrainer((8,), grid="1x2", mode="resident", client=c, **SETTINGS),
    "mgrit": lambda c: MGRITTrainer((8,), client=c, **SETTINGS),
    "partition": lambda c: PartitionTrainer((8,), client=c, **SETTINGS),
}


@pytest.fixture(scope="module")
def data():
    X = np.random.default_rng(0).normal(size=(120, 6))
    return X, np.argmax(X[:, :3], axis=1)  # three classes


def test_a_live_client_copies_and_pickles_as_itself(client2):
    assert copy.deepcopy(client2) is client2
    assert copy.copy(client2) is client2
    assert pickle.loads(pickle.dumps(client2)) is client2
    assert joblib.hash(client2) == joblib.hash(copy.deepcopy(client2))


@pytest.mark.parametrize("name", list(TRAINERS))
def test_a_trainer_with_a_client_deep_copies_clones_and_hashes(name, client2):
    trainer = TRAINERS[name](client2)
    assert trainer.get_params()["client"] is client2
    assert copy.deepcopy(trainer).client is client2
    assert clone(trainer).client is client2
    assert copy.deepcopy(trainer.get_params())["client"] is client2
    assert joblib.hash(trainer) == joblib.hash(copy.deepcopy(trainer))
    assert joblib.hash(trainer.get_params()) == joblib.hash(clone(trainer).get_params())
    assert pickle.loads(pickle.dumps(trainer)).client is client2  # one process: the same live client


def test_a_client_reference_resolves_to_a_client_of_the_same_scheduler_or_none(client2):
    address = client2.scheduler.address
    other = Client(address, set_as_default=False)
    try:
        saved = pickle.dumps(other)
        # the client itself first, while it serves; then another of the same scheduler
        assert pickle.loads(saved) is other
        other.close()
        assert pickle.loads(saved) is client2
    finally:
        other.close()
    assert resolve_client_reference("Client-elsewhere", address) is client2
    assert resolve_client_reference("Client-elsewhere", "tcp://127.0.0.1:9") is None
    assert resolve_client_reference("Client-elsewhere", None) is None


class _ClusterFinder(pickle.Pickler):
    """A pickler that records what of a cluster an object's pickle would hold: futures, dask arrays."""

    def __init__(self, file):
        super().__init__(file)
        self.found: list[str] = []

    def reducer_override(self, obj):
        if isinstance(obj, Future) or type(obj).__module__.startswith(("dask.array", "dask.highlevelgraph")):
            self.found.append(type(obj).__name__)
        return NotImplemented


@pytest.mark.parametrize("name", list(TRAINERS))
def test_a_fitted_trainers_pickle_holds_nothing_of_its_cluster(name, client2, data):
    X, y = data
    trainer = TRAINERS[name](client2).fit(da.from_array(X, chunks=60), da.from_array(y, chunks=60))
    before = dict(trainer.__dict__)
    finder = _ClusterFinder(open(os.devnull, "wb"))
    finder.dump(trainer)
    assert not finder.found, f"the pickle holds {sorted(set(finder.found))}"
    # pickling does not change the live trainer (an NPT one keeps its model on the grid)
    changed = {k for k in before.keys() | trainer.__dict__.keys() if trainer.__dict__.get(k) is not before.get(k)}
    assert not changed, changed
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(trainer)).predict(X), trainer.predict(X))


@pytest.mark.parametrize("mode", ["graph", "resident"])
def test_a_pickled_npt_trainer_holds_its_model_not_its_checkpoint_folder(mode, client2, data, tmp_path):
    X, y = data
    folder = tmp_path / "run"
    trainer = NPTTrainer((8,), grid="1x2", mode=mode, client=client2, checkpoint=folder, **SETTINGS).fit(X, y)
    expected = trainer.predict_proba(X)
    saved = pickle.dumps(trainer)
    assert trainer.__dict__.get("_model") is None  # the live trainer still reads its model where it is
    shutil.rmtree(folder)
    np.testing.assert_allclose(pickle.loads(saved).predict_proba(X), expected, rtol=1e-10, atol=1e-12)


def test_a_trainer_loaded_from_a_fit_on_dask_arrays_asks_for_data_to_continue(client2, data):
    X, y = data
    trainer = TRAINERS["npt-graph"](client2).fit(da.from_array(X, chunks=60), da.from_array(y, chunks=60))
    again = pickle.loads(pickle.dumps(trainer))
    with pytest.raises(ValueError, match="X=None is not valid: expected training data: this trainer is a copy"):
        again.partial_fit()
    assert again.partial_fit(X, y).n_steps_ > trainer.n_steps_


def test_a_saved_trainer_predicts_in_a_fresh_process_after_its_cluster_is_gone(tmp_path, data):
    X, y = data
    np.save(tmp_path / "X.npy", X)
    cluster = local_cluster(2, threads_per_worker=1, dashboard=False, memory_limit="1GiB")
    c = Client(cluster, set_as_default=False)
    expected = {}
    try:
        for name, make in TRAINERS.items():
            # the graph-mode NPT trainer on dask arrays: its training data is a graph over this cluster's keys
            dask_input = name == "npt-graph"
            Xf, yf = (da.from_array(X, chunks=60), da.from_array(y, chunks=60)) if dask_input else (X, y)
            trainer = make(c).fit(Xf, yf)
            expected[name] = trainer.predict_proba(X), trainer.predict(X)
            joblib.dump(trainer, tmp_path / f"{name}.joblib")
    finally:
        c.close()
        cluster.close()
    script = textwrap.dedent(
        f"""
        import joblib, numpy as np
        from distributed import Client
        X = np.load("X.npy")
        assert not list(Client._instances)
        for name in {list(TRAINERS)!r}:
            trainer = joblib.load(name + ".joblib")
            assert trainer.client is None, trainer.client
            np.save(name + "-proba.npy", trainer.predict_proba(X))
            np.save(name + "-labels.npy", trainer.predict(X))
        assert not list(Client._instances), "predicting started a client"
        """
    )
    # the subprocess imports the daskann that this test imported
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(daskann.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for name, (proba, labels) in expected.items():
        np.testing.assert_allclose(np.load(tmp_path / f"{name}-proba.npy"), proba, rtol=1e-10, atol=1e-12, err_msg=name)
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}-labels.npy"), labels, err_msg=name)
