"""Layout-independent initialisation: the same seeded weights on any grid, born on their cells.

The reference below draws every tile of the definition (``daskann.nn.MLP``'s
docstring) element by element and shares no code with the package.
"""

from __future__ import annotations

import math
import pickle
import re

import numpy as np
import pytest
from distributed import get_task_stream

from daskann import MLP, NPTTrainer, SerialTrainer
from daskann.data import make_linear
from daskann.nn import init_bias_block, init_weight_block
from daskann.npt._run import RunStart
from daskann.npt.graph_mode import GraphEngine
from daskann.npt.grid import ProcessGrid

SIZES = (300, 130, 7)  # crosses the 128-wide tiles in both directions; no grid here divides it
GRIDS = [("1x1", False), ("2x2", False), ("3x3", True), ("2x4", True)]


def _reference(sizes, seed):
    weights, biases = [], []
    for layer, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        k = 1.0 / math.sqrt(n_in)
        w = np.empty((n_in, n_out))
        for ti in range(0, n_in, 128):
            for tj in range(0, n_out, 128):
                h, v = min(128, n_in - ti), min(128, n_out - tj)
                tile = np.random.default_rng([seed, layer, 0, ti // 128, tj // 128]).uniform(-k, k, (h, v))
                w[ti : ti + h, tj : tj + v] = tile
        b = np.concatenate(
            [
                np.random.default_rng([seed, layer, 1, 0, tj // 128]).uniform(-k, k, min(128, n_out - tj))
                for tj in range(0, n_out, 128)
            ]
        )
        weights.append(w)
        biases.append(b)
    return weights, biases


def test_mlp_initialisation_follows_the_documented_tiles():
    net = MLP(SIZES, seed=11)
    weights, biases = _reference(SIZES, 11)
    for got, want in zip(net.params, [p for wb in zip(weights, biases, strict=True) for p in wb], strict=True):
        assert np.array_equal(got, want)
    bare = MLP(SIZES, seed=11, bias=False)
    assert bare.biases == [] and all(np.array_equal(a, b) for a, b in zip(bare.weights, weights, strict=True))
    single = MLP(SIZES, seed=11, dtype="float32")
    assert all(np.array_equal(a, b.astype(np.float32)) for a, b in zip(single.weights, weights, strict=True))
    assert not np.array_equal(MLP(SIZES, seed=12).weights[0], net.weights[0])
    # the distribution of torch.nn.Linear: U(-1/sqrt(n_in), 1/sqrt(n_in))
    assert np.abs(net.weights[0]).max() <= 1 / math.sqrt(300) and np.std(net.weights[0]) * math.sqrt(900) > 0.95


def test_any_block_decomposition_gives_the_same_values():
    rng = np.random.default_rng(0)
    net = MLP(SIZES, seed=4)
    for _ in range(30):
        layer = int(rng.integers(2))
        n_in, n_out = SIZES[layer], SIZES[layer + 1]
        shape = (n_in, n_out)
        rows = np.unique(np.concatenate([[0, n_in], rng.integers(0, n_in + 1, rng.integers(0, 5))]))
        cols = np.unique(np.concatenate([[0, n_out], rng.integers(0, n_out + 1, rng.integers(0, 5))]))
        whole = np.block(
            [
                [
                    init_weight_block(4, layer, shape, (r0, r1), (c0, c1))
                    for c0, c1 in zip(cols[:-1], cols[1:], strict=True)
                ]
                for r0, r1 in zip(rows[:-1], rows[1:], strict=True)
            ]
        )
        assert np.array_equal(whole, net.weights[layer])
        pieces = [init_bias_block(4, layer, shape, (c0, c1)) for c0, c1 in zip(cols[:-1], cols[1:], strict=True)]
        assert np.array_equal(np.concatenate(pieces), net.biases[layer])
    empty = init_weight_block(4, 0, SIZES[:2], (5, 5), (0, 3))
    assert empty.shape == (0, 3)
    with pytest.raises(ValueError, match=r"rows=\(0, 301\)"):
        init_weight_block(4, 0, SIZES[:2], (0, 301), (0, 3))


@pytest.mark.parametrize("chains", [0, 2])
@pytest.mark.parametrize("grid,share", GRIDS)
def test_graph_mode_births_serial_weights_on_every_grid(client4, grid, share, chains):
    serial = SerialTrainer((130,), seed=9)._initial_model(SerialTrainer((130,), seed=9)._check_settings(), 300, 7, None)
    grid = ProcessGrid.from_client(client4, grid, share_workers=share)
    settings = {"dtype": "float64", "loss": "mse", "output": "linear"}
    engine = GraphEngine(client4, grid, sizes=SIZES, settings=settings, prefix="daskann-npt-test-born", chains=chains)
    with get_task_stream(client4) as stream:
        state = engine.start_state(RunStart(seed=9))
        model, velocity = state.gather({k: getattr(serial, k) for k in ("activation", "output", "negative_slope")})
    assert all(np.array_equal(a, b) for a, b in zip(model.params, serial.params, strict=True))
    assert all(not v.any() for v in velocity) and [v.shape for v in velocity] == [p.shape for p in serial.params]
    born = [r for r in stream.data if "-born-" in str(r["key"])]
    assert born
    for record in born:
        m = re.search(r"-(?:wv|w|v)\d+-(\d+)-(\d+)$", record["key"]) or re.search(r"-b\d+-(\d+)$", record["key"])
        cell = (int(m.group(1)), int(m.group(2))) if m.lastindex == 2 else (0, int(m.group(1)))
        assert record["worker"] == grid.owner(*cell), record["key"]


def _scatters(monkeypatch, client):
    """Every value ``client.scatter`` sends, recorded as ``(key, nbytes)``."""
    sent = []
    original = client.scatter

    def scatter(data, *args, **kwargs):
        for key, value in data.items() if isinstance(data, dict) else []:
            sent.append((key, _nbytes(value)))
        return original(data, *args, **kwargs)

    monkeypatch.setattr(client, "scatter", scatter)
    return sent


def _nbytes(value) -> int:
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return int(getattr(value, "nbytes", 0))


@pytest.mark.parametrize("mode", ["graph", "resident"])
@pytest.mark.parametrize("grid,share", GRIDS[1:])
def test_npt_weights_are_born_on_the_grid_not_scattered(client4, monkeypatch, mode, grid, share):
    X, y = make_linear(60, 40, 3, noise=0.1, seed=1)
    kwargs = dict(lr=0.05, batch_size=12, seed=6, sgd={"momentum": 0.9})
    sent = _scatters(monkeypatch, client4)
    npt = NPTTrainer((150,), grid=grid, mode=mode, engine={"share_workers": share}, client=client4, **kwargs).fit(
        X, y, steps=3
    )
    serial = SerialTrainer((150,), **kwargs).fit(X, y, steps=3)
    for a, b in zip(npt.model_.params + npt.velocity_, serial.model_.params + serial.velocity_, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
    # only the data travels from the client (a copy of X's and y's bands per grid row at most), never a weight or
    # velocity block: together they are larger than that
    bound = npt.grid_.rows * (X.nbytes + y.nbytes) + 4096
    assert 2 * sum(p.nbytes for p in npt.model_.params) > bound
    assert sum(n for _, n in sent) <= bound, sent
    assert not any(re.search(r"-(?:init\d+|born)-", str(k)) for k, _ in sent), sent


def test_weights_are_dask_arrays_on_the_grid(client4):
    X, y = make_linear(60, 9, 5, noise=0.1, seed=1)
    npt = NPTTrainer((11,), grid="2x2", mode="graph", client=client4, batch_size=12, seed=2).fit(X, y, steps=2)
    weights, biases = npt.weights_, npt.biases_
    assert [w.chunks for w in weights] == [((5, 4), (6, 5)), ((6, 5), (3, 2))]
    assert [b.chunks for b in biases] == [((6, 5),), ((3, 2),)]
    for got, want in zip(weights + biases, npt.model_.weights + npt.model_.biases, strict=True):
        assert np.array_equal(client4.compute(got).result(), want)
    # no data moved: each block is where its cell is
    state = npt._grid_state
    where = client4.who_has([state.futures[b.key] for line in state.weight_mats[0].blocks for b in line])
    for i, j in npt.grid_.cells():
        assert where[state.weight_mats[0].blocks[i][j].key] == (npt.grid_.owner(i, j),)
    again = pickle.loads(pickle.dumps(npt))  # the grid's futures are left out, the client kept as a reference
    assert again.client is client4 and npt._grid_state is not None
    assert isinstance(again.weights_[0], np.ndarray) and np.array_equal(again.weights_[1], npt.model_.weights[1])
    serial = SerialTrainer((11,), batch_size=12, seed=2).fit(X, y, steps=2)
    assert isinstance(serial.weights_[0], np.ndarray) and np.array_equal(serial.biases_[1], serial.model_.biases[1])
