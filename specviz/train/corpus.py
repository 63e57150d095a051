"""The training corpus: the Python source of the pinned transformers package.

Every machine the project runs on has ``transformers==5.17.0`` installed, and its ``.py`` files are
byte-identical everywhere (49 MB), so each machine builds the same corpus locally with no download.
The Python standard library is *not* used: it differs between Python versions (3.11 on CI, 3.12 on
the GPU machine).

Split rule (fixed, no randomness): a file is held out iff the first byte of
``sha256(relpath.encode("utf-8"))`` is divisible by ``HOLDOUT_MODULUS`` (20), i.e. about 5% of files.
The list hash of a split is ``sha256`` of the lines ``f"{relpath}\\t{sha256(file bytes)}\\n"`` joined
in sorted relpath order; the model card records it so a rebuild can be checked byte for byte.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from dataclasses import dataclass

PINNED_TRANSFORMERS = "5.17.0"
HOLDOUT_MODULUS = 20


@dataclass(frozen=True)
class SourceFile:
    """One corpus file.

    relpath: path relative to the transformers package directory, "/"-separated.
    sha256:  hex digest of the file's bytes.
    text:    the file decoded as UTF-8 (strict; every file of the pinned package decodes).
    """

    relpath: str
    sha256: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """The split corpus. train / heldout: files sorted by relpath; *_hash: see module docstring."""

    train: tuple[SourceFile, ...]
    heldout: tuple[SourceFile, ...]

    @property
    def train_hash(self) -> str:
        return list_hash(self.train)

    @property
    def heldout_hash(self) -> str:
        return list_hash(self.heldout)

    def summary(self) -> dict:
        """Plain-data description (file counts, bytes, hashes) for logs and the model card."""
        return {
            "source": f"transformers=={PINNED_TRANSFORMERS} package, all .py files",
            "holdout_rule": f"sha256(relpath)[0] % {HOLDOUT_MODULUS} == 0",
            "train_files": len(self.train),
            "train_bytes": sum(len(f.text.encode()) for f in self.train),
            "train_list_sha256": self.train_hash,
            "heldout_files": len(self.heldout),
            "heldout_bytes": sum(len(f.text.encode()) for f in self.heldout),
            "heldout_list_sha256": self.heldout_hash,
        }


def is_heldout(relpath: str) -> bool:
    """The fixed split rule: True iff sha256(relpath)[0] % HOLDOUT_MODULUS == 0."""
    return hashlib.sha256(relpath.encode("utf-8")).digest()[0] % HOLDOUT_MODULUS == 0


def list_hash(files: tuple[SourceFile, ...] | list[SourceFile]) -> str:
    """sha256 hex of "relpath\\tsha256\\n" lines in the given (sorted) order."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relpath}\t{f.sha256}\n".encode("utf-8"))
    return h.hexdigest()


def transformers_root() -> str:
    """Directory of the installed transformers package.

    Raises RuntimeError if the installed version is not PINNED_TRANSFORMERS (the corpus would differ).
    """
    version = importlib.metadata.version("transformers")
    if version != PINNED_TRANSFORMERS:
        raise RuntimeError(f"corpus needs transformers=={PINNED_TRANSFORMERS}, found {version}")
    import transformers

    return os.path.dirname(transformers.__file__)


def list_relpaths(root: str) -> list[str]:
    """Every ``.py`` file under root, as sorted "/"-separated relative paths."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                out.append(rel.replace(os.sep, "/"))
    return sorted(out)


def read_file(root: str, relpath: str) -> SourceFile:
    """Read one file; raises UnicodeDecodeError if it is not UTF-8."""
    with open(os.path.join(root, *relpath.split("/")), "rb") as fh:
        data = fh.read()
    return SourceFile(relpath, hashlib.sha256(data).hexdigest(), data.decode("utf-8"))


def build_corpus(max_train_files: int | None = None, max_heldout_files: int | None = None) -> Corpus:
    """Read and split the corpus.

    max_train_files / max_heldout_files: keep only the first N of each split (sorted order); the
    smoke preset uses a handful. None keeps all.
    Raises RuntimeError if transformers is not the pinned version.
    """
    root = transformers_root()
    rels = list_relpaths(root)
    train_rels = [r for r in rels if not is_heldout(r)][:max_train_files]
    held_rels = [r for r in rels if is_heldout(r)][:max_heldout_files]
    train = tuple(read_file(root, r) for r in train_rels)
    heldout = tuple(read_file(root, r) for r in held_rels)
    return Corpus(train=train, heldout=heldout)
