"""Stacks as folded text (`outer;inner;leaf 42` per line): what flamegraph.pl, inferno and
speedscope read.

Frames go from the root to the leaf; a kernel frame gets flamegraph.pl's `_[k]` suffix so the
kernel part is drawn in its own colour; `;` and newlines inside a name are replaced, since they
are the format's separators.
"""

from __future__ import annotations

from typing import IO

from probescope.aggregate.maps import KEY_MODULE_PREFIX
from probescope.aggregate.values import Frame, Stacks

UNKNOWN_MODULE = "[unknown]"


def is_kernel_frame(frame: Frame) -> bool:
    """Kernel frames carry `[kernel]` or a kernel module's `[name]` as module, never a path."""
    module = frame.module
    return (
        module.startswith("[")
        and module != UNKNOWN_MODULE
        and not module.startswith(KEY_MODULE_PREFIX)
    )


def frame_name(frame: Frame) -> str:
    name = frame.function.replace(";", ":").replace("\n", " ")
    return name + "_[k]" if is_kernel_frame(frame) else name


def folded_lines(stacks: Stacks) -> list[str]:
    """One `root;...;leaf weight` line per distinct folded stack, sorted."""
    merged: dict[str, int] = {}
    for stack, weight in stacks:
        text = ";".join(frame_name(frame) for frame in reversed(stack)) or "[no stack]"
        merged[text] = merged.get(text, 0) + weight
    return [f"{text} {weight}" for text, weight in sorted(merged.items())]


def render_folded(stacks: Stacks, stream: IO[str]) -> None:
    for line in folded_lines(stacks):
        stream.write(line + "\n")
