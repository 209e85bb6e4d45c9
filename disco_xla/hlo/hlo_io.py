"""Read and write HLO modules: binary protos, HLO text, gzip, XLA dump directories.

Formats, by content first and extension second:
- a serialized HloModuleProto (`.pb`, `.hlo.pb`);
- HLO text (`.txt`, `.hlo`), which begins with `HloModule`;
- either one gzip-compressed (`.gz`);
- a directory written by `--xla_dump_to`, from which we take the
  `*before_optimizations*` module (or the one named by `module_name`).
"""

from __future__ import annotations

import gzip
import os
import zlib

from disco_xla.errors import DiscoInputError
from disco_xla.hlo import xla_text
from disco_xla.hlo.graph import HloModule

OUTPUT_FORMATS = ".pb, .hlo.pb, .txt or .hlo, optionally with .gz"
SUPPORTED_FORMATS = f"{OUTPUT_FORMATS}, or an XLA dump directory"
_TEXT_EXTENSIONS = (".txt", ".hlo")
_PROTO_EXTENSIONS = (".pb",)
_GZIP_MAGIC = b"\x1f\x8b"


# XLA's SPMD partitioner pass: a dump after it is one partition's program.
PARTITIONER_PASS = "spmd-partitioning"


def load_module(path: str | os.PathLike, module_name: str | None = None) -> HloModule:
    """Load an HLO module from a file or an XLA dump directory.

    Any problem with the input raises `DiscoInputError` naming the file.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = _choose_from_dump(path, module_name)
    elif not os.path.exists(path):
        raise DiscoInputError(path, "no such file or directory")
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise DiscoInputError(path, f"cannot read it ({error.strerror})") from None
    return module_from_bytes(data, path)


def module_from_bytes(data: bytes, source: str) -> HloModule:
    """Parse file contents of any supported format; `source` names it in errors."""
    if not data:
        raise DiscoInputError(source, "the file is empty")
    compressed = data[:2] == _GZIP_MAGIC
    if compressed:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as error:
            raise DiscoInputError(source, f"corrupt gzip data ({error})") from None
        if not data:
            raise DiscoInputError(source, "the compressed file is empty")
    suffix = ".gz" if compressed else ""
    name = source[: -len(".gz")] if source.endswith(".gz") else source
    text = _as_hlo_text(data)
    if text is not None:
        proto_bytes = xla_text.text_to_proto_bytes(text, source)
        return HloModule.from_bytes(proto_bytes, source, "txt" + suffix)
    if name.endswith(_TEXT_EXTENSIONS):
        raise DiscoInputError(source, "not HLO text: it does not begin with 'HloModule'")
    if not name.endswith(_PROTO_EXTENSIONS) and _looks_like_text(data):
        raise DiscoInputError(
            source,
            f"not an HLO module (a text file that is not HLO text); expected {SUPPORTED_FORMATS}",
        )
    return HloModule.from_bytes(data, source, "pb" + suffix)


def module_from_text(text: str, source: str = "<text>") -> HloModule:
    """Parse HLO text (through XLA's parser, in its isolated worker)."""
    return HloModule.from_bytes(xla_text.text_to_proto_bytes(text, source), source, "txt")


def module_to_text(module: HloModule) -> str:
    """Print a module as parsable HLO text, with metadata and large constants."""
    return xla_text.proto_bytes_to_text(module.to_bytes(), module.source)


def save_module(module: HloModule, path: str | os.PathLike) -> None:
    """Write a module; the format follows the extension (.pb, .txt, .hlo, + .gz)."""
    path = os.fspath(path)
    compressed = path.endswith(".gz")
    name = path[: -len(".gz")] if compressed else path
    if name.endswith(_PROTO_EXTENSIONS):
        data = module.to_bytes()
    elif name.endswith(_TEXT_EXTENSIONS):
        data = module_to_text(module).encode()
    else:
        raise DiscoInputError(path, f"unknown output format; use {OUTPUT_FORMATS}")
    if compressed:
        data = gzip.compress(data, mtime=0)
    try:
        with open(path, "wb") as file:
            file.write(data)
    except OSError as error:
        raise DiscoInputError(path, f"cannot write it ({error.strerror})") from None


def _as_hlo_text(data: bytes) -> str | None:
    head = data[:64].lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head.startswith(b"HloModule"):
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _looks_like_text(data: bytes) -> bool:
    sample = data[:4096]
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(byte >= 32 or byte in b"\t\r\n" for byte in sample)


def _choose_from_dump(directory: str, module_name: str | None) -> str:
    """Pick the module file from an `--xla_dump_to` directory.

    Candidates are the `*before_optimizations*` files (or, when `module_name` is
    given, files whose name contains it). Where XLA also dumped a module after
    its SPMD partitioner (`--xla_dump_hlo_pass_re=spmd-partitioning`), that one
    is taken instead: for a step split by the partitioner (a sharded `jax.jit`)
    it is the program that holds the all-reduces. A binary proto is preferred to
    the text of the same module. Among several modules we take the largest,
    which for a training script is the training step, and the caller can name
    another.
    """
    try:
        names = sorted(os.listdir(directory))
    except OSError as error:
        raise DiscoInputError(directory, f"cannot list the directory ({error.strerror})") from None
    readable = [
        n for n in names if _strip_compression(n).endswith(_TEXT_EXTENSIONS + _PROTO_EXTENSIONS)
    ]
    if module_name:
        matching = [n for n in readable if n == module_name] or [
            n for n in readable if module_name in n
        ]
        candidates = [n for n in matching if "before_optimizations" in n] or matching
        wanted = f"module file whose name contains {module_name!r}"
    else:
        candidates = [n for n in readable if f"after_{PARTITIONER_PASS}." in n] or [
            n for n in readable if "before_optimizations" in n
        ]
        wanted = "*before_optimizations* module file"
    if not candidates:
        raise DiscoInputError(directory, f"no {wanted} in this directory")
    by_module: dict[str, str] = {}
    for name in candidates:
        stem = _module_stem(name)
        if stem not in by_module or _strip_compression(name).endswith(_PROTO_EXTENSIONS):
            by_module[stem] = name
    chosen = max(
        by_module.values(),
        key=lambda n: (os.path.getsize(os.path.join(directory, n)), n),
    )
    return os.path.join(directory, chosen)


def _strip_compression(name: str) -> str:
    return name[: -len(".gz")] if name.endswith(".gz") else name


def _module_stem(name: str) -> str:
    name = _strip_compression(name)
    for extension in (".hlo.pb", ".pb", ".txt", ".hlo"):
        if name.endswith(extension):
            return name[: -len(extension)]
    return name
