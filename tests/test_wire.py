"""Blocks moved between worker processes arrive aligned (daskann._wire)."""

from __future__ import annotations

import numpy as np
import pytest
from distributed.protocol import deserialize, serialize

from daskann._wire import MIN_BYTES, WireArray, call, for_transfer
from daskann.npt.matrix import GraphBuilder


def test_round_trip_gives_plain_equal_array():
    x = np.arange(64 * 1024, dtype=float).reshape(256, 256)[:, 3:200]  # a strided view too
    header, frames = serialize(for_transfer(x), serializers=("dask",))
    back = deserialize(header, frames)
    assert type(back) is np.ndarray
    np.testing.assert_array_equal(back, x)


def test_ufuncs_return_plain_arrays():
    x = np.ones((300, 300)).view(WireArray)
    assert type(x + 1) is np.ndarray
    assert type(x @ x) is np.ndarray
    assert type(x.sum(axis=0)) is np.ndarray
    out = np.empty((300, 300)).view(WireArray)
    np.multiply(x, 2.0, out=out)
    np.testing.assert_array_equal(out, 2.0)


def test_for_transfer():
    big, small = np.zeros(MIN_BYTES // 8), np.zeros(4)
    value = for_transfer({"w": big, "b": small, "loss": 1.0})
    assert type(value["w"]) is WireArray and value["w"].base is big
    assert type(value["b"]) is np.ndarray and value["loss"] == 1.0
    assert type(for_transfer(small)) is np.ndarray
    assert for_transfer("text") == "text"
    assert type(call(np.ones, (200, 200))) is WireArray


def _make(n, salt):
    return {"w": np.full((n, n), salt), "v": np.full((n, n), -salt), "loss": float(salt)}


def _alignment(x, d):
    return [a.flags.aligned for a in (x, d["w"], d["v"])], type(x + 1).__name__


@pytest.mark.parametrize("n", [200, 1024])
def test_pinned_results_arrive_aligned_on_other_worker(client2, n):
    """Without the lead buffer, the first array of each message lands at the header's end, often unaligned."""
    a, b = sorted(client2.scheduler_info()["workers"])
    builder = GraphBuilder(client2, f"wire-{n}")
    builder.add("x", np.ones, (n, n), owner=a)
    builder.add("d", _make, n, 3.0, owner=a)
    builder.add("y", _alignment, builder.ref("x"), builder.ref("d"), owner=b)
    futures = builder.submit(["y", "x", "d"])
    aligned, kind = futures["y"].result()
    assert aligned == [True, True, True]  # numpy's own test before it hands an array to BLAS uncopied
    assert kind == "ndarray"
    x, d = futures["x"].result(), futures["d"].result()
    assert type(x) is np.ndarray and type(d["w"]) is np.ndarray
    np.testing.assert_array_equal(d["v"], -3.0)


def test_numpy_functions_return_plain_arrays():
    x = np.ones((300, 300)).view(WireArray)
    assert type(np.concatenate([x, x])) is np.ndarray
    assert type(np.block([[x, x]])) is np.ndarray
    assert type(np.vdot(x, x)) is not WireArray
