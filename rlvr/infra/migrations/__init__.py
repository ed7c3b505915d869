"""The store's schema migrations: alembic's script directory, shipped inside the package.

`rlvr.infra.migrate` runs them from code (every service's start, `rlvr db upgrade`); there is no
alembic.ini. `env.py` compares against `rlvr.infra.schema`, the one declaration of the tables, and
`versions/` holds one revision per change of that schema since the first release (docs/migrations.md).
"""
