"""Compile small C/C++ test programs once per content hash, into a per-user cache directory."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

CACHE = Path(os.environ.get("PROBESCOPE_TEST_BUILD", Path.home() / ".cache" / "probescope-tests"))


def compile_program(
    source: str,
    name: str,
    flags: Sequence[str] = ("-O0", "-g"),
    *,
    language: str = "c",
    post: Sequence[Sequence[str]] = (),
) -> Path:
    """Build `source` with gcc (or g++) and `flags`; return the binary's path.

    `post` holds extra commands run after linking, with `{out}` replaced by the binary path
    (e.g. `objcopy --only-keep-debug`). The result is cached by content, flags and commands.
    """
    compiler = "g++" if language == "c++" else "gcc"
    key = hashlib.sha256(
        "\0".join([compiler, source, name, *flags, *("\1".join(p) for p in post)]).encode()
    ).hexdigest()[:16]
    out_dir = CACHE / f"{name}-{key}"
    out = out_dir / name
    if out.exists():
        return out
    tmp_dir = out_dir.with_suffix(".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    src = tmp_dir / (f"{name}.cc" if language == "c++" else f"{name}.c")
    src.write_text(source)
    tmp_out = tmp_dir / name
    subprocess.run([compiler, *flags, "-o", str(tmp_out), str(src)], check=True)
    for command in post:
        subprocess.run([part.replace("{out}", str(tmp_out)) for part in command], check=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp_dir.rename(out_dir)
    return out
