"""Blocks that arrive aligned when dask moves them between processes.

distributed's TCP comm reads the first uncompressed buffer of a message into
the same allocation as the message's header (``distributed.comm.tcp``), at
whatever offset the header ends: the first numpy array of a task's result or of
a resident-mode message arrives on the receiving worker at an address that is
often not a multiple of its item size. numpy copies such an array before every
matrix product that reads it, since BLAS needs aligned operands. Measured on a
2-core machine, in graph-mode steps of a 4096-wide net on a 2x1 grid: those
copies took 1.7% of both cores, and the step about 2% longer (median of five
runs each).

:class:`WireArray` is an ndarray that serialises behind an 8-byte lead buffer,
so that the lead takes the header's allocation and the block's data is read
into an allocation of its own, aligned as every numpy array is. It arrives as
a plain ndarray. Pinned tasks (:class:`daskann.npt.matrix.GraphBuilder`) store
their results as wire arrays, and resident mode sends its blocks as wire arrays.
Should distributed lay its messages out differently, blocks still arrive
intact, if perhaps unaligned.

Blocks under :data:`MIN_BYTES` travel as they are and may arrive unaligned, at
an offset that depends on the rest of the message. numpy's copy of such an
operand takes the product's order (a transposed operand becomes a
C-contiguous one), so BLAS is called another way and rounds differently:
graph mode's kernels copy an unaligned block in its own layout before using it
(:func:`daskann.npt._kernels.operand`), so that results do not depend on how
messages were laid out.
"""

from __future__ import annotations

import numpy as np
from distributed.protocol import dask_deserialize, dask_serialize
from distributed.protocol.numpy import deserialize_numpy_ndarray, serialize_numpy_ndarray

__all__ = ["WireArray", "call", "for_transfer"]

#: smaller blocks travel as they are: distributed joins a message this small into one buffer anyway
MIN_BYTES = 2**17


class WireArray(np.ndarray):
    """An ndarray whose data travels in a buffer of its own (see the module's description).

    ufuncs and numpy functions compute on the plain arrays, so that their
    results, and what a user of an in-process cluster gathers, are plain ndarrays.
    """

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if out is not None:
            kwargs["out"] = _unwrap(out)
        return getattr(ufunc, method)(*_unwrap(inputs), **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return func(*_unwrap(args), **_unwrap(kwargs))


def _unwrap(value):
    """``value`` with every :class:`WireArray` in it (in lists, tuples and dicts) as a plain ndarray view."""
    if isinstance(value, WireArray):
        return value.view(np.ndarray)
    if type(value) in (list, tuple):
        return type(value)(_unwrap(v) for v in value)
    if type(value) is dict:
        return {k: _unwrap(v) for k, v in value.items()}
    return value


def _lead() -> memoryview:
    # a buffer object of its own for each message part: distributed reads the first such object of a
    # message with the header and every later one into an allocation of its own
    return memoryview(np.zeros(8, dtype=np.uint8))


@dask_serialize.register(WireArray)
def _serialize(x: WireArray):
    header, frames = serialize_numpy_ndarray(x.view(np.ndarray))
    return header, [_lead(), *frames]


@dask_deserialize.register(WireArray)
def _deserialize(header, frames) -> np.ndarray:
    return deserialize_numpy_ndarray(header, frames[1:])


def for_transfer(value):
    """``value`` with its large arrays (at the top, or values of a dict) as :class:`WireArray` views."""
    if isinstance(value, np.ndarray):
        return value.view(WireArray) if value.nbytes >= MIN_BYTES and type(value) is np.ndarray else value
    if type(value) is dict:
        return {k: for_transfer(v) if isinstance(v, np.ndarray) else v for k, v in value.items()}
    return value


def call(func, /, *args, **kwargs):
    """``for_transfer(func(*args, **kwargs))``: how a pinned task's result is stored."""
    return for_transfer(func(*args, **kwargs))
