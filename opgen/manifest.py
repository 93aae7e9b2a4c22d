"""The manifest every generated package carries (`opgen-manifest.json`): which spec wrote it, the
hash of each file, and whether its kernels passed the compile check (and with which toolchain).

Rendering and reading live here together, so the format has one definition. `opgen check` uses the
file hashes to tell a hand edit (the file no longer matches what opgen wrote) from a stale file (the
spec or opgen changed), and `opgen build` uses the spec path to refuse replacing a package another
spec owns. A build skips the compile check of kernels whose manifest records a pass of the same
kernels.py and the same jobs with the same toolchain (`compiled_with`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

MANIFEST = "opgen-manifest.json"
GENERATOR_PREFIX = "opgen "


@dataclass(frozen=True)
class Manifest:
    generator: str  # "opgen 0.1.0"
    spec: str  # the spec path the package was built from, as the build showed it
    spec_sha256: str
    files: dict[str, str]  # file inside the package -> sha256 of its bytes
    compile_checked: bool  # every kernel was lowered and compiled when these files were written
    # The toolchain of that check (tilelang, nvcc, target: opgen.compile_cache.Toolchain) and the
    # digest of its jobs ("jobs": opgen.compile_cache.check_record); None when not checked or
    # checked by a build that did not record it.
    compiled_with: dict[str, str] | None = None


class ManifestError(ValueError):
    """A manifest that is not one opgen wrote (corrupt JSON, wrong types, another tool's)."""


def render_manifest(spec: str, spec_sha256: str, generator: str, files: dict[str, str],
                    compile_checked: bool, compiled_with: dict[str, str] | None = None) -> str:
    data = {
        "compile_checked": compile_checked,
        **({"compiled_with": dict(sorted(compiled_with.items()))}
           if compile_checked and compiled_with else {}),
        "files": {name: sha256(text) for name, text in sorted(files.items()) if name != MANIFEST},
        "generator": generator,
        "spec": spec,
        "spec_sha256": spec_sha256,
    }
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def parse_manifest(raw: bytes) -> Manifest:
    """The manifest in raw, or ManifestError saying what is wrong with it."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ManifestError("not valid JSON") from None
    if not isinstance(data, dict):
        raise ManifestError("not a JSON object")
    generator = data.get("generator")
    if not isinstance(generator, str) or not generator.startswith(GENERATOR_PREFIX):
        raise ManifestError(f"not written by opgen (generator {_short(generator)})")
    for key in ("spec", "spec_sha256"):
        if not isinstance(data.get(key), str):
            raise ManifestError(f"'{key}' must be a string (got {_short(data.get(key))})")
    files = data.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise ManifestError(f"'files' must map file names to hashes (got {_short(files)})")
    # Manifests of builds before the compile flag existed say nothing: not known to be checked.
    compiled = data.get("compile_checked", False)
    if not isinstance(compiled, bool):
        raise ManifestError(f"'compile_checked' must be true or false (got {_short(compiled)})")
    tools = data.get("compiled_with")
    if tools is not None and not (isinstance(tools, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in tools.items()
    )):
        raise ManifestError(f"'compiled_with' must map names to strings (got {_short(tools)})")
    return Manifest(generator, data["spec"], data["spec_sha256"], dict(files), compiled,
                    dict(tools) if compiled and tools else None)


def sha256(text: str | bytes) -> str:
    return hashlib.sha256(text.encode("utf-8") if isinstance(text, str) else text).hexdigest()


def _short(value: object, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
