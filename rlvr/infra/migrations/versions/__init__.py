"""One file per revision of the store's schema, oldest first (alembic loads them by path)."""
