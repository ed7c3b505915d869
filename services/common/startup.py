"""Opening the store and the event bus at a service's start, the same way in every service that
needs them: a bad URL becomes one StartupError line naming the setting, its flag and its
environment variable."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rlvr.common.settings import NatsFields, ServiceSettings, SettingsError, StoreFields, setting_label
from rlvr.infra.events import EventBus, EventBusError, redact_url
from rlvr.infra.store import Store, StoreError
from rlvr.services.common.server import StartupError


async def open_store(settings: ServiceSettings) -> Store:
    assert isinstance(settings, StoreFields), f"{type(settings).__name__} has no database_url"
    url = settings.database_url
    if settings.database_password_file is not None:
        from sqlalchemy.engine import make_url

        from rlvr.common.settings import read_secret_file

        password = read_secret_file(settings.database_password_file, setting_label(settings, "database_password_file"))
        url = make_url(url).set(password=password).render_as_string(hide_password=False)
    try:
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        store = await asyncio.to_thread(Store, url)
        await asyncio.to_thread(store.upgrade)
    except (StoreError, OSError) as e:
        raise StartupError(f"{setting_label(settings, 'database_url')}: {e}") from None
    return store


async def open_bus(settings: ServiceSettings, name: str) -> EventBus:
    assert isinstance(settings, NatsFields), f"{type(settings).__name__} has no nats_url"
    try:
        url, ca_file = settings.nats_connection()
    except SettingsError as e:
        raise StartupError(str(e)) from None
    try:
        return await EventBus.connect(url, name=name, tls_ca_file=ca_file)
    except (EventBusError, OSError) as e:
        raise StartupError(f"{setting_label(settings, 'nats_url')} = {redact_url(url)!r}: {e}") from None
