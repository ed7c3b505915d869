"""Writes the DDL that an earlier commit's `create_all` ran, as the fixture of the migration tests.

    .venv/bin/python tests/data/make_schema_fixture.py COMMIT [COMMIT ...]

For each commit: `git show COMMIT:rlvr/infra/schema.py` into a temporary folder, imported in a
fresh interpreter (SQLModel's metadata is global, so one schema per process), and its tables'
`create_all` run on a mock engine of each dialect, which records every statement instead of
executing it. The statements go to tests/data/schema_<commit>.<dialect>.sql, one per
`;`-terminated paragraph; tests/test_migrations.py runs them to make a database of that commit.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DIALECTS = ("sqlite", "postgresql")

_DUMP = """
import sys
from sqlalchemy import create_mock_engine
import old_schema

statements = []
engine = create_mock_engine(sys.argv[1] + "://", lambda sql, *a, **k: statements.append(
    str(sql.compile(dialect=engine.dialect)).strip()))
old_schema.SQLModel.metadata.create_all(engine, tables=[t.__table__ for t in old_schema.TABLES],
                                        checkfirst=False)
print("\\n\\n".join(s + ";" for s in statements))
"""


def dump(commit: str) -> None:
    source = subprocess.run(["git", "show", f"{commit}:rlvr/infra/schema.py"], check=True,
                            capture_output=True, text=True, cwd=HERE).stdout
    short = subprocess.run(["git", "rev-parse", "--short=7", commit], check=True, capture_output=True,
                           text=True, cwd=HERE).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "old_schema.py").write_text(source)
        for dialect in DIALECTS:
            ddl = subprocess.run([sys.executable, "-c", _DUMP, dialect], check=True, capture_output=True,
                                 text=True, cwd=tmp).stdout
            out = HERE / f"schema_{short}.{dialect}.sql"
            out.write_text(f"-- create_all of rlvr/infra/schema.py at commit {short} ({dialect}), "
                           f"made by tests/data/make_schema_fixture.py\n\n{ddl}")
            print(out)


if __name__ == "__main__":
    for commit in sys.argv[1:]:
        dump(commit)
