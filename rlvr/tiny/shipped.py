"""The bundled models rlvr ships built, and the check that a name resolves to exactly those bits.

A build's floating point differs by CPU vendor even with the kernels pinned to their AVX2 code: the
recipe of `rlvr-tiny-headroom` gave other bits on an Intel Xeon than on the AMD EPYC hosts the
docs' figures come from (docs/design.md), and so another demo. So the model ships in the package
as built there (rlvr/data/models/<name>/, about 10 MB) with the sha256 of every file in one
manifest (rlvr/data/models/manifest.json), and resolving its name installs that copy under
$RLVR_HOME/models, where every loader looks for a model folder, checking each file against the
manifest before and after the copy and on every later use. A folder there whose files differ (a
build from the recipe made before the model shipped, or a changed file) is moved aside to
`<name>.local`, saying which file differs, and the shipped copy installed: it is never trained as if
it were the bundled model, and nothing of it is lost.

The recipe still builds the model (`rlvr models build-tiny --size headroom`, into `<name>.rebuilt`
beside the installed copy), and `compare_with_shipped` says whether that build gave the shipped bits.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from rlvr.transfer import file_sha256

SHIPPED_ROOT = Path(__file__).resolve().parent.parent / "data" / "models"
MANIFEST_FILE = "manifest.json"
REBUILT_SUFFIX = ".rebuilt"  # where `build-tiny` writes a shipped model it rebuilds from the recipe


class ShippedModelError(RuntimeError):
    """A shipped model's file is missing or holds other bytes than its manifest records."""


def manifest(root: Path = SHIPPED_ROOT) -> dict[str, dict[str, object]]:
    """The manifest: for each shipped name its build's record (`size`, `seed`, `build`, `built_on`)
    and `files`, each file's sha256 by its path in the model folder. Empty when nothing ships."""
    try:
        return dict(json.loads((root / MANIFEST_FILE).read_text()))
    except FileNotFoundError:
        return {}


def is_shipped(name: str, root: Path = SHIPPED_ROOT) -> bool:
    return name in manifest(root)


def shipped_files(name: str, root: Path = SHIPPED_ROOT) -> dict[str, str]:
    """The shipped model's files and their sha256; KeyError when `name` does not ship."""
    files = manifest(root)[name]["files"]
    assert isinstance(files, dict), f"{MANIFEST_FILE}: {name}'s files are not a mapping"
    return {str(rel): str(sha) for rel, sha in files.items()}


def differences(folder: Path, files: Mapping[str, str]) -> list[str]:
    """One line for each of `files` (path -> sha256) that `folder` lacks or holds with other bytes.

    >>> differences(Path("/nonexistent"), {"config.json": "ab" * 32})
    ['config.json: missing from /nonexistent']
    """
    found = []
    for rel, expected in files.items():
        path = folder / rel
        if not path.is_file():
            found.append(f"{rel}: missing from {folder}")
        elif (actual := file_sha256(path)) != expected:
            found.append(f"{rel}: sha256 {actual[:12]}... where the manifest has {expected[:12]}...")
    return found


def install_shipped(name: str, out: Path, root: Path = SHIPPED_ROOT,
                    progress: Callable[[str], None] | None = None) -> Path:
    """`out` holding the shipped model `name`: copied from the package the first time, checked against
    the manifest every time. ShippedModelError naming the file when the package's copy or the
    installed one differs. The caller holds the folder's lock."""
    files = shipped_files(name, root)
    if out.exists():
        bad = differences(out, files)
        if not bad:
            return out
        # A build from the recipe on this machine (the name was built before it shipped: on another
        # CPU vendor, other bits) or a changed file: kept beside, never trained as the bundled model.
        aside = _free_name(out.with_name(out.name + ".local"))
        out.rename(aside)
        if progress:
            progress(f"{out} was not the bundled {name} ({'; '.join(bad)}): moved to {aside}; name that folder "
                     f"by its path to train it")
    source = root / name
    if bad := differences(source, files):
        raise ShippedModelError(f"the shipped {name} in {source} is damaged ({'; '.join(bad)}): reinstall rlvr")
    staging = out.with_name(out.name + ".partial")  # renamed into place whole, as a build is
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for rel in files:
        shutil.copyfile(source / rel, staging / rel)
    if bad := differences(staging, files):  # a disk that kept other bytes than it was given
        raise ShippedModelError(f"copying the shipped {name} into {staging} went wrong ({'; '.join(bad)})")
    staging.rename(out)
    if progress:
        progress(f"installed the shipped {name} (model.safetensors sha256 {files['model.safetensors'][:12]}...) "
                 f"into {out}")
    return out


def _free_name(path: Path) -> Path:
    """`path`, or `path-2`, `path-3` ... whichever is not there yet."""
    k = 1
    candidate = path
    while candidate.exists():
        k += 1
        candidate = path.with_name(f"{path.name}-{k}")
    return candidate


def compare_with_shipped(name: str, folder: Path, root: Path = SHIPPED_ROOT) -> str:
    """One line saying whether `folder` (a build from the recipe) holds the bits rlvr ships as `name`."""
    files = shipped_files(name, root)
    bad = differences(folder, files)
    if not bad:
        return f"the build is bit for bit the shipped {name} (model.safetensors sha256 {files['model.safetensors']})"
    built_on = manifest(root)[name].get("built_on", "another host")
    return (f"the build differs from the shipped {name} ({'; '.join(bad)}); the shipped one was built on "
            f"{built_on}, and a build's floating point differs by CPU vendor: `{name}` still names the shipped bits")


def ship(name: str, build: Path, record: Mapping[str, object], built_on: str, skip: Collection[str] = (),
         root: Path = SHIPPED_ROOT) -> dict[str, str]:
    """Copy `build`'s files (all but `skip`) into the package as `name` and record them in the
    manifest, with the build's `record` (its report less what varies between runs) and `built_on`.
    Returns the files and their sha256."""
    target = root / name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    files = {}
    for path in sorted(p for p in build.iterdir() if p.is_file() and p.name not in skip):
        shutil.copyfile(path, target / path.name)
        files[path.name] = file_sha256(target / path.name)
    entries = manifest(root)
    entries[name] = {**record, "built_on": built_on, "files": files}
    (root / MANIFEST_FILE).write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    return files
