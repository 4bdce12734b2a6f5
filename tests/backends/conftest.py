"""Fixtures of the backend tests."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def one_worker_group(monkeypatch):
    """torchrun's environment for one worker, and the process group left behind removed."""
    dist = pytest.importorskip("torch.distributed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
