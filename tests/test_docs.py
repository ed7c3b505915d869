"""The docs cannot rot: README.md, CONTRIBUTING.md and every page under docs/ are read here.

- every `rlvr ...` command line (in a bash block or inline) parses with the real CLI's argparse;
  a synopsis (`rlvr jobs list [--limit N] | show ID`) is expanded into its commands first;
- every `make X` names a Makefile target;
- a block marked `<!-- docs-test: run -->` runs as written (a Python block's `print(...)  # out`
  comments are the output it must print), and `<!-- docs-test: sdk -->` Python blocks run against a
  SchedulerService on loopback that validates the spec with the scheduler's own rules;
- every Python block is run by this file or names the test that runs it;
- the front page stays a front page, the docs describe main (no history phrases), and nothing
  points outside the repository or at a file it lacks.

The site itself (every page in the nav, every link and anchor) is `mkdocs build --strict`, in
`make lint` and in the last test below.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from rlvr import jobspec
from rlvr.clients import cli
from rlvr.common.errors import InvalidArgument
from rlvr.v1 import common_pb2 as C
from rlvr.v1 import scheduler_pb2 as S
from rlvr.v1 import scheduler_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
BIN = Path(sys.executable).parent


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str  # the `<!-- ... -->` comment right above the fence, or ""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page (fences at the start of a line, as mkdocs and GitHub read them)."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = re.match(r"```(\w*)\s*$", lines[i])
        if not match:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = lines[i - 1].strip() if i else ""
        marker = above if above.startswith("<!--") else ""
        found.append(Block(page, i + 1, match.group(1), "\n".join(lines[i + 1:end]) + "\n", marker))
        i = end + 1
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]


def marked(kind: str, lang: str | None = None) -> list[Block]:
    return [b for b in ALL_BLOCKS if f"docs-test: {kind}" in b.marker and (lang is None or b.lang == lang)]


# ---------------------------------------------------------------- rlvr command lines

PLACEHOLDERS = {"N": "2", "ID": "abc123", "DIR": "out", "FILE": "out.csv", "BENCHMARK": "gsm8k", "C": "accuracy",
                "H": "127.0.0.1", "P": "8050", "A": "127.0.0.1:50051", "B": "127.0.0.1:50055", "K": "1",
                "NAME:VERSION": "job-x:3", "NAME": "job-x", "HOST:PORT": "127.0.0.1:50051"}


def expand(command: str) -> list[str]:
    """A documented command line -> the concrete commands it stands for: `a / b` and `x | y` are
    alternatives (a later one takes the first one's `rlvr GROUP`), `[...]` is optional (kept),
    `csv|jsonl` a choice (the first), `...` and "rlvr train's flags" mean more of the same (dropped),
    and the upper-case placeholders take a value of their kind."""
    command = tidy(command)
    command = re.sub(r"\[([^\]|]*?) \| [^\]]*\]", r"[\1]", command)  # [--job ID | --loop ID]: the first
    command = re.sub(r"(?<=\S)\|(?=\S)", " PIPE_CHOICE ", command)
    commands: list[str] = []
    for whole in command.split(" / "):
        parts = [p.strip() for p in whole.split(" | ")]
        prefix = " ".join(parts[0].split()[:2])
        for k, part in enumerate(parts):
            commands.append(part if k == 0 else f"{prefix} {part}")
    out = []
    for c in commands:
        c = re.sub(r"\S+ PIPE_CHOICE \S+", lambda m: m.group(0).split(" PIPE_CHOICE ")[0], c)
        c = c.replace("PIPE_CHOICE", "").replace("[", " ").replace("]", " ").replace("...", " ")
        c = re.sub(r"<[^>]+>", "abc123", c)
        out.append(c)
    return out


def argv_of(command: str) -> list[str]:
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value rlvr ...
        words.pop(0)
    assert words[0] == "rlvr", command
    return [PLACEHOLDERS.get(w, w) for w in words[1:]]


def tidy(command: str) -> str:
    """A command line without its comment, its table escapes and its prose placeholders."""
    command = re.sub(r"\s+#\s.*$", "", command).replace("\\|", "|").strip()
    command = command.replace("NAME[:VERSION]", "job-x:3")
    return re.sub(r"\[[^\]]*'s flags\]", "", command)


def _open_quote(line: str) -> bool:
    try:
        shlex.split(tidy(line))
    except ValueError:
        return True
    return False


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line) for every `rlvr ...` in a bash block (continuations joined) or inline."""
    found: list[tuple[str, str]] = []
    for b in ALL_BLOCKS:
        if b.lang != "bash" or "docs-test: skip" in b.marker or "docs-test: run" in b.marker:
            continue  # a block that runs is checked by running it
        lines = re.sub(r"\\\n\s*", " ", b.code).splitlines()
        n = 0
        while n < len(lines):
            line, start = lines[n].strip().removeprefix("$ "), n
            while _open_quote(line) and n + 1 < len(lines):  # a quoted argument over several lines
                n += 1
                line += " " + lines[n].strip()
            n += 1
            if re.match(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)*rlvr\s", line + " "):
                found.append((f"{b.id}+{start + 1}", line))
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for span in re.findall(r"`(rlvr [^`]+)`", line):
                if not span.startswith("rlvr ["):
                    found.append((f"{page.relative_to(ROOT)}:{n} inline", span))
    return found


def passthrough_parser(argv: list[str]):  # type: ignore[no-untyped-def]
    """The parser a passthrough command hands its arguments to, as cli.py builds it."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"rlvr {argv[0]}")
    if argv[0] in ("up", "status"):
        stack = importlib.import_module("rlvr.clients.stack")
        (getattr(stack, f"add_{argv[0]}_arguments", None) or stack.add_arguments)(parser)
        return parser, argv[1:]
    if argv[0] == "web":
        importlib.import_module("rlvr.clients.web.server").add_arguments(parser)
        return parser, argv[1:]
    if argv[:2] == ["models", "build-tiny"]:
        return importlib.import_module("rlvr.tiny.__main__")._parser(), ["build", *argv[2:]]
    if argv[:2] == ["models", "inspect"]:
        return importlib.import_module("rlvr.tiny.__main__")._parser(), ["eval", "--diagnose", *argv[2:]]
    raise AssertionError(f"a passthrough command this test does not know: rlvr {' '.join(argv)}")


def parse_error(argv: list[str]) -> str | None:
    """None when `rlvr ARGV` parses (or asks for --help), else argparse's message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args, rest = cli.build_parser().parse_known_args(argv)
            if getattr(args, "passthrough", False):
                parser, rest = passthrough_parser(argv)
                parser.parse_args(rest)
            elif rest:
                return f"unrecognized arguments: {rest}"
    except SystemExit as e:
        return None if e.code in (0, None) else err.getvalue().strip().splitlines()[-1]
    return None


COMMANDS = [(where, c) for where, line in documented_commands() for c in expand(line)]


def test_the_docs_show_rlvr_commands() -> None:
    assert len(COMMANDS) > 100  # the parser below reads the docs, not an empty list


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[f"{w} {c}"[:90] for w, c in COMMANDS])
def test_every_documented_rlvr_command_parses(where: str, command: str) -> None:
    error = parse_error(argv_of(command))
    if where.endswith(" inline") and error and re.search(r"arguments are required|expected one argument", error):
        error = None  # prose names a command or a flag (`rlvr jobs show`, `--backend`) without its values
    assert error is None, f"{where}: `{command}`: {error}"


def test_a_wrong_flag_in_the_docs_would_fail() -> None:
    assert parse_error(argv_of("rlvr train --group-size 8 --rnak 4")) is not None
    assert parse_error(argv_of("rlvr up --base-prot 0")) is not None
    assert parse_error(argv_of("rlvr jobs show ID")) is None
    assert expand("rlvr events tail [--job ID | --eval ID]") == ["rlvr events tail  --job ID "]
    assert expand("rlvr jobs list [--limit N] | show ID   # the jobs") == ["rlvr jobs list  --limit N ",
                                                                          "rlvr jobs show ID"]


def test_every_make_target_in_the_docs_exists() -> None:
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    used = {t for b in ALL_BLOCKS if b.lang == "bash" for t in re.findall(r"^\s*make ([\w-]+)", b.code, re.M)}
    used |= {t for page in PAGES for t in re.findall(r"`make ([\w-]+)`", page.read_text())}
    assert used and used <= targets, used - targets


# ---------------------------------------------------------------- blocks that run


def expected_prints(code: str) -> list[str]:
    """The outputs a Python block's `print(...)  # out` comments promise, in order."""
    return [m.group(1).strip() for m in re.finditer(r"^\s*print\(.*\)\s+#\s*(.*)$", code, re.M)]


RUN_BLOCKS = marked("run")


def test_some_blocks_are_marked_to_run() -> None:
    assert {b.lang for b in RUN_BLOCKS} >= {"bash", "python"}


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.id for b in RUN_BLOCKS])
def test_a_block_marked_run_runs_as_written(block: Block, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RLVR_HOME": str(tmp_path)}
    if block.lang == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    else:
        argv = [sys.executable, "-c", block.code]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{block.id}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    if block.lang == "python":
        assert done.stdout.splitlines() == expected_prints(block.code), block.id


class Scheduler(scheduler_pb2_grpc.SchedulerServiceServicer):
    """A SchedulerService that validates and resolves a spec with the scheduler's own rules
    (rlvr.jobspec), then runs every job to completion at once: status, one metric per step, the end."""

    def __init__(self) -> None:
        self.jobs: dict[str, C.Job] = {}

    def CreateJob(self, request, context):  # noqa: N802 (the contract's name)
        try:
            resolved = jobspec.resolve_spec(request.spec)
        except InvalidArgument as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        job = C.Job(id=f"job-{len(self.jobs) + 1}", spec=resolved.spec, status=C.JOB_STATUS_QUEUED,
                    summary=resolved.summary, total_steps=resolved.total_steps)
        self.jobs[job.id] = job
        return S.CreateJobResponse(job=job, summary=resolved.summary, warnings=resolved.warnings)

    def GetJob(self, request, context):  # noqa: N802
        job = self.jobs[request.id]
        return C.Job(id=job.id, status=C.JOB_STATUS_COMPLETED, adapter=C.AdapterRef(name=job.id,
                                                                                        version=job.total_steps))

    def WatchJob(self, request, context):  # noqa: N802
        job = self.jobs[request.id]
        yield C.JobEvent(status=C.JobStatusEvent(job_id=job.id, status=C.JOB_STATUS_RUNNING))
        for step in range(1, job.total_steps + 1):
            yield C.JobEvent(metric=C.MetricEvent(job_id=job.id, step=step, total_steps=job.total_steps,
                                                  reward_mean=step / 10, adapter_version=step - 1))
        yield C.JobEvent(status=C.JobStatusEvent(job_id=job.id, status=C.JOB_STATUS_COMPLETED))

    def DownloadAdapter(self, request, context):  # noqa: N802
        for path, data in (("adapter_config.json", b"{}"), ("adapter_model.safetensors", b"0123")):
            yield C.FileChunk(path=path, offset=0, data=data, file_size=len(data), last=True)


@pytest.fixture
def scheduler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Scheduler]:
    fake = Scheduler()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("RLVR_SCHEDULER_ADDRESS", f"127.0.0.1:{port}")
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RLVR_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    try:
        yield fake
    finally:
        server.stop(0)


SDK_PAGES = sorted({b.page for b in marked("sdk", "python")})


def test_the_front_page_and_the_sdk_page_carry_an_sdk_example() -> None:
    assert {ROOT / "README.md", ROOT / "docs" / "sdk.md"} <= set(SDK_PAGES)


@pytest.mark.parametrize("page", SDK_PAGES, ids=[str(p.relative_to(ROOT)) for p in SDK_PAGES])
def test_the_sdk_examples_run_as_written(page: Path, scheduler: Scheduler, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, object] = {"__name__": "__main__"}
    code = [b for b in marked("sdk", "python") if b.page == page]
    for block in code:  # a page's blocks in order, in one namespace (the async one reuses `spec`)
        exec(compile(block.code, block.id, "exec"), namespace)  # noqa: S102 (the docs' own code)
    out = capsys.readouterr().out
    for step in (1, 2, 3):
        assert f"step {step}: reward {step / 10:.3f}" in out
    assert len(scheduler.jobs) == 2  # the sync and the async example each created one
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["adapter_config.json",
                                                                        "adapter_model.safetensors"]


def test_the_sdk_example_spec_is_checked_by_the_scheduler_rules(scheduler: Scheduler) -> None:
    from rlvr.clients.sdk import RlvrError, connect

    with connect() as rlvr, pytest.raises(RlvrError) as e:
        rlvr.scheduler.create_job(S.CreateJobRequest(spec=C.JobSpec(grpo=C.GrpoConfig(lora_rank=1000))))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "lora_rank" in str(e.value)


def test_every_python_block_is_run_by_a_test() -> None:
    for b in (b for b in ALL_BLOCKS if b.lang == "python"):
        if "docs-test: run" in b.marker or "docs-test: sdk" in b.marker:
            continue
        named = re.search(r"tests/(test_\w+\.py)", b.marker)
        assert named, f"{b.id}: mark it <!-- docs-test: run --> or name the test that runs it"
        test = ROOT / "tests" / named.group(1)
        assert test.exists() and str(b.page.relative_to(ROOT)) in test.read_text(), (b.id, test)


# ---------------------------------------------------------------- the rules of the docs


def test_the_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for must in ("make demo", "make test", "connect_async", "docs/architecture.md", "docs/design.md"):
        assert must in text, must


def test_the_docs_describe_main_not_history() -> None:
    pattern = re.compile(r"before this change|previous stop|the issue's", re.I)
    for page in PAGES:
        hits = [n for n, line in enumerate(page.read_text().splitlines(), 1) if pattern.search(line)]
        assert not hits, f"{page.relative_to(ROOT)}: lines {hits}"


def test_every_measurement_page_says_its_command_date_and_machine() -> None:
    for page in sorted((ROOT / "docs" / "measurements").glob("*.md")):
        if page.name == "index.md":
            continue
        text = page.read_text()
        assert "ommand" in text and re.search(r"20\d\d-\d\d-\d\d|Date:", text) and "achine" in text, page.name


def test_the_repository_links_only_to_itself() -> None:
    outside = re.compile(r"\.\./shared|/work/shared|/work/main")
    checked = [*PAGES, ROOT / "mkdocs.yml", *sorted((ROOT / "tests").rglob("*.py"))]
    for path in checked:
        if path == Path(__file__).resolve():
            continue
        assert not outside.search(path.read_text()), path.relative_to(ROOT)
    for page in (ROOT / "README.md", ROOT / "CONTRIBUTING.md"):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not re.match(r"[a-z]+:", target):
                assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_every_docs_file_the_code_cites_exists() -> None:
    cited: set[str] = set()
    for folder in ("clients", "services", "rlvr", "bench", "deploy", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh", ".js", ".html") and "v1" not in path.parts:
                text = path.read_text(errors="replace")
                if path != Path(__file__).resolve():
                    assert "DESIGN.md" not in text and "STYLE.md" not in text, path
                cited |= set(re.findall(r"\bdocs/[\w/.-]+\.md\b", text))
    cited |= set(re.findall(r"\bdocs/[\w/.-]+\.md\b", (ROOT / "pyproject.toml").read_text()))
    assert "docs/design.md" in cited
    missing = sorted(c for c in cited if not (ROOT / c).exists())
    assert not missing, missing


def test_the_tracker_files_the_docs_name_are_the_ones_written() -> None:
    """docs/tracking.md names MLflow's completions table by the name the tracker gives step 1."""
    from rlvr.tracking.mlflow_tracker import completions_artifact

    page = (ROOT / "docs" / "tracking.md").read_text()
    assert f"`{completions_artifact(1)}`" in page
    assert not re.search(r"completions/step_[^0-9]", page), "a step's artifact shown by another name"


@pytest.mark.skipif(shutil.which("mkdocs", path=str(BIN)) is None, reason="mkdocs is a dev extra (make install)")
def test_the_site_builds_strict(tmp_path: Path) -> None:
    done = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
