"""The training corpus: Python sources of installed packages (and the standard library), chosen by a manifest.

No data set can be downloaded on any machine the project runs on, but every machine has Python packages
installed. A **manifest** (JSON, ``specviz/train/manifests/*.json``) names the packages (``name==version``
pins, or a bare name whose version is resolved at build time and recorded), whether the standard library is
included, a file filter and the hold-out rules. :func:`build_corpus` reads the matching ``.py`` files of each
distribution (``importlib.metadata``: the files its RECORD lists), filters them, de-duplicates by content hash
and splits them; :meth:`Corpus.summary` records every resolved pin and a hash of each split, which the model
card quotes so that a rebuild can be checked byte for byte.

File filter (``Manifest``): ``.py`` files only; no ``__pycache__`` and no directory named in
``exclude_dirs`` (tests, vendored copies); UTF-8 only; at most ``max_file_bytes``; no line longer than
``max_line_chars`` (generated tables, minified data); at least ``min_lines`` lines. Files whose bytes equal an
earlier file's (sorted by relpath) are dropped. Per distribution at most ``max_package_bytes`` of training
files are kept (files taken in ``sha256(relpath)`` order), so one huge package cannot dominate.

Splits (fixed, no randomness). relpath = the path inside site-packages (unique: one distribution owns each
path), e.g. ``"sklearn/linear_model/_base.py"``, or ``"stdlib/<path>"`` for the standard library.

* ``heldout_packages``: every file of a distribution named in ``heldout_packages`` (whole packages never seen in
  training, for an out-of-package evaluation);
* ``heldout``: other files with ``sha256(relpath)[0] % heldout_modulus == 0``; for a distribution named in
  ``legacy_holdout`` the rule is the v1 recipe's, ``sha256(inner path)[0] % m == 0``, so that the v1 model's
  held-out transformers files stay held out and both families can be compared on them;
* ``train``: the rest.

The list hash of a split is ``sha256`` of ``f"{relpath}\\t{sha256(bytes)}\\n"`` lines in sorted relpath order.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST_DIR = Path(__file__).resolve().parent / "manifests"
STDLIB = "stdlib"


class CorpusError(RuntimeError):
    """A manifest cannot be honoured here (a pinned version differs, a package is missing in strict mode)."""


@dataclass(frozen=True)
class Manifest:
    """What goes into a corpus (see the module docstring for the rules).

    packages: "name==version" (pinned) or "name" (resolved at build time, recorded in the summary).
    stdlib: include the running interpreter's standard library (its version is recorded).
    strict: a missing package or a pin that differs raises CorpusError; otherwise it is skipped and recorded.
    """

    name: str
    packages: tuple[str, ...] = ()
    stdlib: bool = False
    strict: bool = True
    exclude_dirs: tuple[str, ...] = ("tests", "test", "testing", "_vendor", "vendor", "site-packages")
    stdlib_exclude: tuple[str, ...] = ("idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "pydoc_data")
    max_file_bytes: int = 300_000
    max_line_chars: int = 500
    min_lines: int = 5
    max_package_bytes: int | None = None
    heldout_packages: tuple[str, ...] = ()
    heldout_modulus: int = 40
    legacy_holdout: dict[str, int] = field(default_factory=dict)
    stdlib_version: str | None = None  # pin of the standard library (the interpreter's version), checked like a package
    description: str = ""

    @classmethod
    def load(cls, name_or_path: str) -> "Manifest":
        """A manifest by name (``specviz/train/manifests/<name>.json``) or by path. Raises FileNotFoundError."""
        named = MANIFEST_DIR / f"{name_or_path}.json"
        path = named if named.exists() else Path(name_or_path)
        data = json.loads(path.read_text())
        for key in ("packages", "exclude_dirs", "stdlib_exclude", "heldout_packages"):
            if key in data:
                data[key] = tuple(data[key])
        return cls(**data)


@dataclass(frozen=True)
class SourceFile:
    """One corpus file. relpath: the path inside site-packages ("stdlib/<path>" for the standard library); sha256: hex digest of its bytes;
    text: the file decoded as UTF-8; package: the distribution name (or "stdlib")."""

    relpath: str
    sha256: str
    text: str
    package: str = ""


@dataclass(frozen=True)
class Corpus:
    """The split corpus: files sorted by relpath in each split; ``sources``: resolved pins and counts."""

    train: tuple[SourceFile, ...]
    heldout: tuple[SourceFile, ...]
    heldout_packages: tuple[SourceFile, ...] = ()
    manifest: Manifest | None = None
    sources: dict = field(default_factory=dict)

    @property
    def train_hash(self) -> str:
        return list_hash(self.train)

    @property
    def heldout_hash(self) -> str:
        return list_hash(self.heldout)

    def summary(self) -> dict:
        """Plain-data description (pins, rules, file counts, bytes, list hashes) for logs and the model card."""
        out = {"manifest": asdict(self.manifest) if self.manifest else None, "sources": self.sources}
        for name in ("train", "heldout", "heldout_packages"):
            files = getattr(self, name)
            out[f"{name}_files"] = len(files)
            out[f"{name}_bytes"] = sum(len(f.text.encode()) for f in files)
            out[f"{name}_list_sha256"] = list_hash(files)
        return out


def list_hash(files) -> str:
    """sha256 hex of "relpath\\tsha256\\n" lines in the given (sorted) order."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relpath}\t{f.sha256}\n".encode("utf-8"))
    return h.hexdigest()


def _first_byte(text: str) -> int:
    return hashlib.sha256(text.encode("utf-8")).digest()[0]


def split_of(relpath: str, package: str, m: Manifest) -> str:
    """"train" | "heldout" | "heldout_packages" for one file (the module docstring's rules)."""
    if package in m.heldout_packages:
        return "heldout_packages"
    if package in m.legacy_holdout:  # relpath = "<package dir>/<path inside it>", as v1 hashed it
        inner = relpath.split("/", 1)[1]
        return "heldout" if _first_byte(inner) % m.legacy_holdout[package] == 0 else "train"
    return "heldout" if _first_byte(relpath) % m.heldout_modulus == 0 else "train"


def _distribution_files(name: str) -> tuple[str, list[tuple[str, Path]]]:
    """(version, [(path inside site-packages, absolute path)]) of an installed distribution's .py files."""
    dist = importlib.metadata.distribution(name)
    files = []
    for f in dist.files or []:
        rel = str(f).replace(os.sep, "/")
        if rel.endswith(".py") and not rel.startswith("..") and "/__pycache__/" not in rel:
            files.append((rel, Path(dist.locate_file(f))))
    return dist.version, sorted(files)


def _stdlib_files(m: Manifest) -> tuple[str, list[tuple[str, Path]]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        top = rel_dir.split("/")[0]
        if top in m.stdlib_exclude:
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and d not in m.exclude_dirs)
        for name in filenames:
            if name.endswith(".py"):
                rel = f"{rel_dir}/{name}" if rel_dir != "." else name
                files.append((rel, Path(dirpath) / name))
    return ".".join(map(str, sys.version_info[:3])), sorted(files)


def _keep(rel: str, data: bytes, m: Manifest) -> str | None:
    """The decoded text if the file passes the filter, else None."""
    parts = rel.split("/")[:-1]
    if any(p in m.exclude_dirs for p in parts) or len(data) > m.max_file_bytes:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = text.splitlines()
    if len(lines) < m.min_lines or any(len(line) > m.max_line_chars for line in lines):
        return None
    return text


def _parse_pin(spec: str) -> tuple[str, str | None]:
    name, _, version = spec.partition("==")
    return name.strip(), (version.strip() or None)


def _sources(m: Manifest) -> tuple[dict, list[tuple[str, str, Path]]]:
    """Resolve the manifest: (record of pins and skips, [(package, relpath, absolute path)])."""
    record: dict = {"resolved": {}, "skipped": {}}
    out: list[tuple[str, str, Path]] = []
    for spec in m.packages:
        name, pin = _parse_pin(spec)
        try:
            version, files = _distribution_files(name)
        except importlib.metadata.PackageNotFoundError:
            if m.strict:
                raise CorpusError(f"manifest {m.name!r} needs {spec}, which is not installed here") from None
            record["skipped"][name] = "not installed"
            continue
        if pin is not None and version != pin:
            if m.strict:
                raise CorpusError(f"manifest {m.name!r} pins {name}=={pin}, found {version}")
            record["skipped"][name] = f"pinned {pin}, found {version}"
            continue
        record["resolved"][name] = version
        out += [(name, rel, path) for rel, path in files]
    if m.stdlib:
        version, files = _stdlib_files(m)
        if m.stdlib_version is not None and version != m.stdlib_version and m.strict:
            raise CorpusError(f"manifest {m.name!r} pins the standard library of Python {m.stdlib_version}, "
                              f"this interpreter is {version}")
        record["resolved"][STDLIB] = version
        out += [(STDLIB, f"{STDLIB}/{rel}", path) for rel, path in files]
    return record, out


def build_corpus(manifest: Manifest | str = "transformers-5.17", max_train_files: int | None = None,
                 max_heldout_files: int | None = None) -> Corpus:
    """Read, filter, de-duplicate and split the corpus a manifest describes.

    manifest: a Manifest, a manifest name or a path. max_train_files / max_heldout_files: keep only the first N
    of the train / each held-out split (sorted order; the smoke preset uses a handful). Raises CorpusError
    (strict manifests) when a package is missing or a pin differs.
    """
    m = Manifest.load(manifest) if isinstance(manifest, str) else manifest
    record, sources = _sources(m)
    seen: set[str] = set()
    splits: dict[str, list[SourceFile]] = {"train": [], "heldout": [], "heldout_packages": []}
    counts = {"listed": len(sources), "filtered_out": 0, "duplicates": 0, "over_package_cap": 0}
    for package, rel, path in sorted(sources, key=lambda s: s[1]):
        try:
            data = path.read_bytes()
        except OSError:
            counts["filtered_out"] += 1
            continue
        text = _keep(rel, data, m)
        if text is None:
            counts["filtered_out"] += 1
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen:
            counts["duplicates"] += 1
            continue
        seen.add(digest)
        splits[split_of(rel, package, m)].append(SourceFile(rel, digest, text, package))
    splits["train"] = _cap_packages(splits["train"], m.max_package_bytes, counts)
    record["counts"] = counts
    return Corpus(train=tuple(splits["train"][:max_train_files]), heldout=tuple(splits["heldout"][:max_heldout_files]),
                  heldout_packages=tuple(splits["heldout_packages"][:max_heldout_files]), manifest=m, sources=record)


def _cap_packages(files: list[SourceFile], cap: int | None, counts: dict) -> list[SourceFile]:
    """At most ``cap`` bytes of training files per package (taken in sha256(relpath) order), sorted by relpath."""
    if cap is None:
        return files
    by_pkg: dict[str, list[SourceFile]] = {}
    for f in files:
        by_pkg.setdefault(f.package, []).append(f)
    kept = []
    for group in by_pkg.values():
        total = 0
        for f in sorted(group, key=lambda f: hashlib.sha256(f.relpath.encode()).hexdigest()):
            size = len(f.text.encode())
            if total + size > cap:
                counts["over_package_cap"] += 1
                continue
            total += size
            kept.append(f)
    return sorted(kept, key=lambda f: f.relpath)
