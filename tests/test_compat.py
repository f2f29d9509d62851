"""The private dask names daskann uses are found in one module, with a clear error when they are not."""

from __future__ import annotations

import dask
import pytest

from daskann import _compat


def test_private_names_resolve_on_the_installed_dask():
    assert callable(_compat.parse_input)
    assert _compat.Task is not None and _compat.TaskRef is not None


def test_an_old_dask_names_the_supported_range(monkeypatch):
    monkeypatch.setattr(dask, "__version__", "2024.12.1")
    expected = r"dask >= 2026\.1.*dask 2024\.12\.1.*supports dask and distributed >= 2026\.1"
    with pytest.raises(ImportError, match=expected):
        _compat._check_versions()


def test_set_current_client_restores_the_previous_one():
    from distributed.client import default_client

    before = _compat._current_client.get()
    marker = object()
    with _compat.set_current_client(marker):
        assert default_client() is marker
    assert _compat._current_client.get() is before
