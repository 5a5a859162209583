"""Shared fixtures: the real peers every test uses (see tests/fixtures/)."""

from __future__ import annotations

pytest_plugins = [
    "tests.fixtures.redis",
    "tests.fixtures.ssh",
    "tests.fixtures.slack",
    "tests.fixtures.slurm",
    "tests.fixtures.pagers",
]
