"""The rollout server's adapter registry: validation, atomic storage, live versions and their lifetime.

The most reported failure in peer RL systems is an adapter push that silently never reaches the rollout
engine. Here a push either becomes the live version (checked, stored atomically, accepted by the backend)
or fails loudly with the previous live version untouched; requests resolve the live version once, hold a
lease on it while they run, and an old version leaves the backend and the disk only when its last lease
ends, so a request never sees its adapter change or vanish under it.

Only `adapter_config.json` and `adapter_model.safetensors` are ever read; nothing is unpickled.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import json
import logging
import math
import os
import re
import shutil
import struct
import tempfile
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from rlvr.adapters import ADAPTER_NAME_RE
from rlvr.common.errors import FailedPrecondition, NotFound
from rlvr.services.rollout.backend import AdapterVersion, GenerationBackend

__all__ = [
    "AdapterCapacityError",
    "AdapterRegistry",
    "AdapterRejected",
    "AdapterVersionMismatch",
    "StaleVersionError",
    "UnknownAdapterError",
]

logger = logging.getLogger(__name__)

MAX_VERSION = 2**63 - 1  # the wire type is int64
DEFAULT_MAX_ADAPTER_BYTES = 512 * 1024 * 1024
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1024 * 1024
MAX_SAFETENSORS_HEADER = 16 * 1024 * 1024
FLOAT_DTYPES = {"F32": 4, "F16": 2, "BF16": 2}  # safetensors dtype -> bytes per element
WEIGHT_PREFIX = "base_model.model."
LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight")
_STORED_VERSION = re.compile(r"v([0-9]{1,19})\.([0-9]{1,19})")  # root/<name>/v<version>.<uid>


class AdapterRejected(ValueError):
    """The upload cannot be served (bad name, size, files, config or weights): INVALID_ARGUMENT."""


class StaleVersionError(FailedPrecondition):
    """A pushed version is not greater than the live one (FAILED_PRECONDITION, not bad input)."""


class UnknownAdapterError(NotFound):
    """No live adapter under that name (NOT_FOUND)."""

    def __str__(self) -> str:  # LookupError would quote the message like a dict key
        return str(self.args[0]) if self.args else ""


class AdapterVersionMismatch(NotFound):
    """A request pinned a version that is not the live one (NOT_FOUND, naming the live version: the
    contract's AdapterSelector); never served silently from another version."""

    def __str__(self) -> str:  # LookupError would quote the message like a dict key
        return str(self.args[0]) if self.args else ""


class AdapterCapacityError(FailedPrecondition):
    """The engine holds as many adapter versions as it can without evicting one (FAILED_PRECONDITION)."""


CAPACITY_WAIT_S = 120.0  # a push waits this long for an old version's last request to end


class AdapterRegistry:
    """Named LoRA adapters, each with one live version, stored under `root/<name>/v<version>.<uid>/`."""

    def __init__(
        self,
        root: Path,
        backend: GenerationBackend,
        base_linear_shapes: Mapping[str, tuple[int, int]],
        max_lora_rank: int,
        max_adapter_bytes: int = DEFAULT_MAX_ADAPTER_BYTES,
    ) -> None:
        self.root = Path(root).resolve()
        self.backend = backend
        self.base_linear_shapes = dict(base_linear_shapes)
        self.max_lora_rank = max_lora_rank
        self.max_adapter_bytes = max_adapter_bytes
        self._live: dict[str, AdapterVersion] = {}
        self._leases: dict[int, int] = {}  # uid -> running requests
        self._retired: dict[int, AdapterVersion] = {}  # superseded/unloaded, waiting for their last lease
        self._uids = itertools.count(1)  # vLLM LoRA ids must be > 0 and never reused
        # One load/unload per name at a time, so the version check and the swap are atomic; different jobs'
        # pushes do not wait for each other.
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._dropped = asyncio.Event()  # set whenever a version leaves the backend
        self._adding = 0  # versions past the capacity check, still loading into the engine
        self.capacity_wait_s = CAPACITY_WAIT_S
        self._staging = self.root / ".staging"
        self.root.mkdir(parents=True, exist_ok=True)
        # Leftovers of a crashed upload are never live (nothing survives a restart), so they can go.
        shutil.rmtree(self._staging, ignore_errors=True)
        self._staging.mkdir()

    # ----------------------------------------------------------------------------------------- queries
    def live_version(self, name: str) -> int | None:
        adapter = self._live.get(name)
        return adapter.version if adapter else None

    def get(self, name: str) -> AdapterVersion | None:
        return self._live.get(name)

    def list(self) -> list[AdapterVersion]:
        return sorted(self._live.values(), key=lambda a: a.name)

    # ----------------------------------------------------------------------------------------- loading
    async def load(self, name: str, version: int, files: Mapping[str, bytes] | Path) -> AdapterVersion:
        """Validate, store and hot-load one adapter version; it is live when this returns.

        `files` is either the two files' bytes by name or a directory holding exactly those two files.
        Raises AdapterRejected (bad name, size, files, config or weights; or the backend refused it) or
        StaleVersionError; in both cases the previous live version keeps serving.
        """
        check_name(name)
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
            raise AdapterRejected(
                f"adapter version must be an integer in [1, {MAX_VERSION}], got {version!r}"
            )
        # Shielded: a caller that goes away mid-push must not leave a half-installed version behind (stored
        # but not live, or loaded in the engine but not recorded); the push completes or fails as a whole.
        return await asyncio.shield(self._load(name, version, files))

    async def _load(self, name: str, version: int, files: Mapping[str, bytes] | Path) -> AdapterVersion:
        async with self._locks[name]:
            self._check_not_stale(name, version)
            uid = next(self._uids)
            rank, stored = await asyncio.to_thread(self._validate_and_store, name, version, uid, files)
            adapter = AdapterVersion(name=name, version=version, path=stored, uid=uid, rank=rank)
            try:
                await self._room_for_one(adapter)
            except AdapterCapacityError:
                shutil.rmtree(stored, ignore_errors=True)
                raise
            try:
                await self.backend.add_adapter(adapter)
            except Exception as e:
                shutil.rmtree(stored, ignore_errors=True)
                logger.warning("backend refused adapter %s: %s", adapter.key, e)
                raise AdapterRejected(
                    f"adapter {name!r} version {version}: the engine refused it: {e}"
                ) from e
            finally:
                self._adding -= 1  # counted in _live from the swap below, or gone
            previous = self._live.get(name)
            self._live[name] = adapter  # the swap: from here on new requests resolve to this version
            logger.info("adapter %s live (uid %d, rank %d)", adapter.key, adapter.uid, rank)
            if previous is not None:
                await self._retire(previous)
            return adapter

    async def _room_for_one(self, adapter: AdapterVersion) -> None:
        """Waits until the backend can take one more version without evicting one that a request
        still uses (vLLM would read it back from disk mid-step): a superseded version leaves when
        its last request ends. Raises AdapterCapacityError when none is waiting to leave (every
        held version is live: as many jobs as the engine has room for) or the wait runs out."""
        capacity = getattr(self.backend, "adapter_capacity", None)
        if capacity is None:
            self._adding += 1
            return
        deadline = asyncio.get_running_loop().time() + self.capacity_wait_s
        # `_adding`: versions of other names past this check and still loading into the engine
        while len(self._live) + len(self._retired) + self._adding >= capacity:
            held = f"{len(self._live)} live, {len(self._retired)} finishing requests" + (
                f", {self._adding} loading" if self._adding else "")
            left = deadline - asyncio.get_running_loop().time()
            if not self._retired or left <= 0:
                raise AdapterCapacityError(
                    f"adapter {adapter.key}: the engine holds {capacity} adapter versions at most and holds "
                    f"{held}" + ("" if not self._retired else f"; none left within {self.capacity_wait_s:g} s"))
            logger.info("adapter %s waits for room in the engine (%s of %d)", adapter.key, held, capacity)
            self._dropped.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dropped.wait(), timeout=left)
        self._adding += 1  # no await since the check: no other push can pass it on the same room

    async def unload(self, name: str) -> AdapterVersion:
        """Stop serving `name`; running requests finish on it. A later push may start again at any version."""
        async with self._locks[name]:
            adapter = self._live.pop(name, None)
            if adapter is None:
                raise UnknownAdapterError(f"no adapter named {name!r} is loaded")
            await self._retire(adapter)
            return adapter

    def _check_not_stale(self, name: str, version: int) -> None:
        live = self._live.get(name)
        if live is not None and version <= live.version:
            raise StaleVersionError(
                f"adapter {name!r} version {version} is not newer than the live version {live.version}"
            )

    def _validate_and_store(
        self, name: str, version: int, uid: int, files: Mapping[str, bytes] | Path
    ) -> tuple[int, Path]:
        """Blocking part of `load` (runs in a thread): read, check, write to staging, rename into place."""
        contents = read_upload(files, self.max_adapter_bytes)
        rank = check_adapter_files(contents, self.base_linear_shapes, self.max_lora_rank)
        # The uid makes the path unique: after an unload, a fresh push may reuse a version number while the
        # old files still serve running requests.
        final = self.root / name / f"v{version}.{uid}"
        staging = Path(tempfile.mkdtemp(prefix=f"{name}.v{version}.", dir=self._staging))
        try:
            for filename, data in contents.items():
                with open(staging / filename, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
            final.parent.mkdir(exist_ok=True)
            if final.exists():
                # Only a leftover of an earlier server process can sit here (uids restart at 1): move it
                # aside so the rename below stays a single atomic step.
                os.replace(final, staging.with_name(staging.name + ".old"))
                shutil.rmtree(staging.with_name(staging.name + ".old"), ignore_errors=True)
            os.replace(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return rank, final

    # ------------------------------------------------------------------------------------------ leases
    @asynccontextmanager
    async def lease(
        self, name: str | None, version: int | None = None
    ) -> AsyncIterator[AdapterVersion | None]:
        """Resolve the adapter for one request, once, and keep that version alive until the block exits.

        `name` None (or "") means the base model. `version` None (or 0) takes the live version; any other
        value must equal it, so a caller that pushed version n can demand completions from exactly n.
        """
        if not name:
            if version:
                raise ValueError(f"adapter.version: {version} given without adapter.name (the base model has no versions)")
            yield None
            return
        adapter = self._live.get(name)
        if adapter is None:
            raise UnknownAdapterError(f"no adapter named {name!r} is loaded")
        if version and version != adapter.version:
            raise AdapterVersionMismatch(
                f"adapter {name!r} version {version} requested but the live version is {adapter.version}"
            )
        self._leases[adapter.uid] = self._leases.get(adapter.uid, 0) + 1
        try:
            yield adapter
        finally:
            self._leases[adapter.uid] -= 1
            if self._leases[adapter.uid] == 0:
                del self._leases[adapter.uid]
                if adapter.uid in self._retired:
                    await self._drop(self._retired.pop(adapter.uid))

    async def _retire(self, adapter: AdapterVersion) -> None:
        if self._leases.get(adapter.uid):
            self._retired[adapter.uid] = adapter  # the last lease drops it
        else:
            await self._drop(adapter)

    async def _drop(self, adapter: AdapterVersion) -> None:
        try:
            await self.backend.remove_adapter(adapter)
        except Exception:  # a failed eviction costs memory, never correctness: the uid is never reused
            logger.exception("could not remove adapter %s from the backend", adapter.key)
        self._dropped.set()
        await asyncio.to_thread(shutil.rmtree, adapter.path, True)

    async def close(self) -> None:
        """Forget everything (the backend is shutting down). Superseded versions' files are removed;
        each live version's stay on disk, for `restore` in the next server process."""
        for adapter in self._retired.values():
            await asyncio.to_thread(shutil.rmtree, adapter.path, True)
        self._live.clear()
        self._retired.clear()

    async def restore(self) -> builtins.list[AdapterVersion]:
        """Makes live again, at their versions, the adapters a previous server process left live on
        disk (a crash or a restart), so a trainer's next request and a benchmark of an older job
        find them as they were. Per name, the newest complete version is loaded through the same
        checks as an upload; other versions of the name are leftovers and go. One that no longer
        passes (another base model) is logged and removed: it could never be served here."""
        restored: builtins.list[AdapterVersion] = []
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir() and p != self._staging):
            if not ADAPTER_NAME_RE.fullmatch(folder.name):
                continue
            stored = []
            for entry in folder.iterdir():
                found = _STORED_VERSION.fullmatch(entry.name)
                if found and (entry / ADAPTER_CONFIG).is_file() and (entry / ADAPTER_WEIGHTS).is_file():
                    stored.append((int(found[1]), int(found[2]), entry))
            if not stored:
                await asyncio.to_thread(shutil.rmtree, folder, True)
                continue
            version, _, newest = max(stored)
            if version > MAX_VERSION:
                continue
            try:
                adapter = await self._load(folder.name, version, newest)
            except AdapterCapacityError as e:  # fine, only no room now (a smaller max_loras): kept on disk
                logger.warning("adapter %s v%d left by a previous server is not restored: %s", folder.name,
                               version, e)
                continue
            except (AdapterRejected, FailedPrecondition) as e:
                logger.warning("adapter %s v%d left by a previous server is not restored: %s", folder.name,
                               version, e)
                await asyncio.to_thread(shutil.rmtree, folder, True)
                continue
            for entry in folder.iterdir():
                if entry != adapter.path:
                    await asyncio.to_thread(shutil.rmtree, entry, True)
            logger.info("adapter %s restored from disk", adapter.key)
            restored.append(adapter)
        return restored


def check_name(name: str) -> None:
    # fullmatch: with match(), "$" would also accept a trailing newline.
    if not isinstance(name, str) or not ADAPTER_NAME_RE.fullmatch(name):
        raise AdapterRejected(f"adapter name {name!r} must match {ADAPTER_NAME_RE.pattern}")


def read_upload(files: Mapping[str, bytes] | Path, max_bytes: int) -> dict[str, bytes]:
    """The upload's two files as bytes, with the size limit and the exact file set enforced."""
    allowed = {ADAPTER_CONFIG, ADAPTER_WEIGHTS}
    if isinstance(files, Path | str):
        # Sizes come from stat() before anything is read, so an oversized spool is never loaded.
        paths = {p.name: p for p in Path(files).iterdir()}
        sizes = {n: (p.stat().st_size if p.is_file() else 0) for n, p in paths.items()}
    else:
        sizes = {n: len(b) for n, b in files.items()}
    extra = sorted(set(sizes) - allowed)
    if extra:
        raise AdapterRejected(f"unexpected files in adapter upload: {extra}; only {sorted(allowed)}")
    if sum(sizes.values()) > max_bytes:
        raise AdapterRejected(f"adapter upload is {sum(sizes.values())} bytes, over the limit of {max_bytes}")
    if isinstance(files, Path | str):
        contents = {n: p.read_bytes() for n, p in paths.items() if p.is_file()}
    else:
        contents = {n: bytes(b) for n, b in files.items()}
    missing = sorted(allowed - set(contents))
    if missing:
        raise AdapterRejected(f"adapter upload lacks {missing}")
    return contents


# --------------------------------------------------------------------------------- content validation
def check_adapter_files(
    contents: Mapping[str, bytes], base_linear_shapes: Mapping[str, tuple[int, int]], max_lora_rank: int
) -> int:
    """Check a PEFT LoRA upload against the base model; return its rank. Raises AdapterRejected."""
    config = _parse_config(contents[ADAPTER_CONFIG], max_lora_rank)
    rank: int = config["r"]
    targets = config["target_modules"]
    leaf_names = {n.rsplit(".", 1)[-1] for n in base_linear_shapes}

    def targeted(module: str) -> bool:
        # peft's own matching: a regex string must match the full name, a list entry a name suffix.
        if isinstance(targets, str):
            return re.fullmatch(targets, module) is not None
        return any(module == t or module.endswith("." + t) for t in targets)

    if isinstance(targets, str):
        if not any(targeted(m) for m in base_linear_shapes):
            raise AdapterRejected(
                f"target_modules pattern {targets!r} matches no linear module of the base model"
            )
    else:
        unknown = sorted(t for t in targets if t not in leaf_names and t not in base_linear_shapes)
        if unknown:
            raise AdapterRejected(
                f"target_modules {unknown} do not exist in the base model (its linear modules: {sorted(leaf_names)})"
            )

    data = contents[ADAPTER_WEIGHTS]
    header = _parse_safetensors_header(data)
    shapes: dict[str, dict[str, tuple[int, int]]] = {}
    for key, entry in header.items():
        if not key.startswith(WEIGHT_PREFIX) or not key.endswith(LORA_SUFFIXES):
            raise AdapterRejected(
                f"unexpected tensor {key!r}: only LoRA A/B weights (base_model.model.*) are served"
            )
        module, part = key[len(WEIGHT_PREFIX) :].rsplit(".lora_", 1)
        if module not in base_linear_shapes:
            raise AdapterRejected(f"tensor {key!r} targets {module!r}, which the base model does not have")
        if not targeted(module):
            raise AdapterRejected(f"tensor {key!r} targets {module!r}, outside the config's target_modules")
        shapes.setdefault(module, {})[part[0]] = tuple(entry["shape"])
    if not shapes:
        raise AdapterRejected(f"{ADAPTER_WEIGHTS} holds no LoRA weights")
    uses_rank_pattern = bool(config.get("rank_pattern"))
    for module, parts in sorted(shapes.items()):
        if set(parts) != {"A", "B"}:
            raise AdapterRejected(
                f"module {module!r} has lora_{''.join(parts)} but not both lora_A and lora_B"
            )
        in_features, out_features = base_linear_shapes[module]
        module_rank = parts["A"][0]
        expected = {"A": (module_rank, in_features), "B": (out_features, module_rank)}
        if parts != expected:
            raise AdapterRejected(
                f"module {module!r}: LoRA shapes A{list(parts['A'])} B{list(parts['B'])} do not fit the base "
                f"model's {in_features}->{out_features} linear layer (is it an adapter for another model?)"
            )
        if not 1 <= module_rank <= max_lora_rank:
            raise AdapterRejected(
                f"module {module!r} has rank {module_rank}; the server's max_lora_rank is {max_lora_rank}"
            )
        if module_rank != rank and not uses_rank_pattern:
            raise AdapterRejected(
                f"module {module!r} has rank {module_rank} but adapter_config.json says r={rank}"
            )
    _check_tensors_load(data)
    return rank


def _parse_config(raw: bytes, max_lora_rank: int) -> dict:
    if len(raw) > MAX_CONFIG_BYTES:
        raise AdapterRejected(f"{ADAPTER_CONFIG} is {len(raw)} bytes, over {MAX_CONFIG_BYTES}")
    try:
        config = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AdapterRejected(f"{ADAPTER_CONFIG} is not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise AdapterRejected(f"{ADAPTER_CONFIG} must be a JSON object")
    if config.get("peft_type") != "LORA":
        raise AdapterRejected(f"peft_type must be 'LORA', got {config.get('peft_type')!r}")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= max_lora_rank:
        raise AdapterRejected(
            f"LoRA rank r={rank!r} must be an integer in [1, {max_lora_rank}] (max_lora_rank)"
        )
    alpha = config.get("lora_alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise AdapterRejected(f"lora_alpha must be a finite number, got {alpha!r}")
    targets = config.get("target_modules")
    if not (isinstance(targets, str) and targets) and not (
        isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets)
    ):
        raise AdapterRejected(
            f"target_modules must be a non-empty list of module names or a regex, got {targets!r}"
        )
    # Features the engines cannot serve faithfully: refuse them rather than generate from a different policy.
    for key, allowed in (
        ("use_dora", (None, False)),
        ("bias", (None, "none")),
        ("lora_bias", (None, False)),
        ("fan_in_fan_out", (None, False)),
    ):
        if config.get(key) not in allowed:
            raise AdapterRejected(f"{key}={config.get(key)!r} is not supported (allowed: {list(allowed)})")
    if config.get("modules_to_save"):
        raise AdapterRejected(
            f"modules_to_save={config['modules_to_save']!r} is not supported: only LoRA weights"
        )
    return config


def _parse_safetensors_header(data: bytes) -> dict[str, dict]:
    """Read the safetensors header by hand: a clear message for each way a file can be broken."""
    if len(data) < 8:
        raise AdapterRejected(f"{ADAPTER_WEIGHTS} is truncated ({len(data)} bytes)")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > MAX_SAFETENSORS_HEADER or 8 + header_len > len(data):
        raise AdapterRejected(f"{ADAPTER_WEIGHTS} has a corrupt header length ({header_len})")
    try:
        header = json.loads(data[8 : 8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AdapterRejected(f"{ADAPTER_WEIGHTS} has a corrupt header: {e}") from e
    if not isinstance(header, dict):
        raise AdapterRejected(f"{ADAPTER_WEIGHTS} has a corrupt header")
    header.pop("__metadata__", None)
    body = len(data) - 8 - header_len
    for key, entry in header.items():
        if not _is_2d_float_entry(entry):
            raise AdapterRejected(f"tensor {key!r} in {ADAPTER_WEIGHTS} is not a 2-D float tensor entry")
        (rows, cols), (start, end) = entry["shape"], entry["data_offsets"]
        if not 0 <= start <= end <= body or end - start != rows * cols * FLOAT_DTYPES[entry["dtype"]]:
            raise AdapterRejected(f"tensor {key!r} in {ADAPTER_WEIGHTS} points outside the file (truncated?)")
    return header


def _is_2d_float_entry(entry: object) -> bool:
    def int_pair(value: object, minimum: int) -> bool:
        return (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, int) and v >= minimum for v in value)
        )

    return (
        isinstance(entry, dict)
        and entry.get("dtype") in FLOAT_DTYPES
        and int_pair(entry.get("shape"), 1)
        and int_pair(entry.get("data_offsets"), 0)
    )


def _check_tensors_load(data: bytes) -> None:
    import torch
    from safetensors.torch import load

    try:
        tensors = load(data)
    except Exception as e:  # the Rust parser's own checks (overlaps, alignment) as a last line
        raise AdapterRejected(f"{ADAPTER_WEIGHTS} does not parse: {e}") from e
    for key, tensor in tensors.items():
        if not bool(torch.isfinite(tensor).all()):
            raise AdapterRejected(f"tensor {key!r} holds NaN or infinite values")
