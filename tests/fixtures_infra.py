"""Shared fixtures for the real infrastructure: an embedded NATS on a free port, the store on a
temporary SQLite file and on this machine's PostgreSQL.

`conftest.py` imports them (`from fixtures_infra import *`). They are
all synchronous on purpose: the test loop and the async-fixture loop have different scopes in
this project's pytest-asyncio settings, so an EventBus is created inside each test
(`async with connected_bus(url)`), on the test's own loop.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rlvr.infra.events import EventBus
from rlvr.infra.nats_server import EmbeddedNats
from rlvr.infra.store import Store

__all__ = ["POSTGRES_URL", "connected_bus", "nats_server", "private_nats", "sqlite_store", "store", "store_url"]

# Override to point the PostgreSQL half of the store tests elsewhere.
POSTGRES_URL = os.environ.get("RLVR_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """One embedded nats-server (JetStream) on a free port for the whole run; tests share its
    `RLVR` stream, so use unique ids per test."""
    with EmbeddedNats(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server of the test's own, for tests that stop or restart it."""
    with EmbeddedNats(tmp_path / "nats") as server:
        yield server


@contextlib.asynccontextmanager
async def connected_bus(url: str, name: str = "test") -> AsyncIterator[EventBus]:
    bus = await EventBus.connect(url, name=name)
    try:
        yield bus
    finally:
        await bus.close()


def _postgres_schema_url(base_url: str) -> tuple[str, str] | None:
    """Create a throwaway schema so parallel runs never share tables; None when unreachable."""
    import psycopg

    schema = f"rlvr_test_{uuid.uuid4().hex[:10]}"
    plain = base_url.replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        with psycopg.connect(plain, connect_timeout=3, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.OperationalError:
        return None
    sep = "&" if "?" in base_url else "?"
    return f"{base_url}{sep}options=-csearch_path%3D{schema}", schema


def _drop_postgres_schema(base_url: str, schema: str) -> None:
    import psycopg

    plain = base_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(plain, connect_timeout=3, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL of each supported kind: a fresh SQLite file, and a fresh schema of the
    PostgreSQL at POSTGRES_URL (skipped, saying why, only when that server cannot be reached)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'rlvr.db'}"
        return
    made = _postgres_schema_url(POSTGRES_URL)
    if made is None:
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_URL} (set RLVR_TEST_POSTGRES_URL)")
    url, schema = made
    try:
        yield url
    finally:
        _drop_postgres_schema(POSTGRES_URL, schema)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """A Store on a SQLite file of the test's own, every table created."""
    s = Store(f"sqlite:///{tmp_path / 'rlvr.db'}")
    s.create_all()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A Store with every table created, on SQLite and on PostgreSQL."""
    s = Store(store_url)
    s.create_all()
    try:
        yield s
    finally:
        s.close()
