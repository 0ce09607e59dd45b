"""Types of the compiled report loop (`_fastformat.c`)."""

from collections.abc import Callable, Iterator

def render(
    streams: list[tuple[int, int, int, int, int, int, Iterator[bytes]]],
    header_event: tuple[int, int, int, int, int],
    resolve: Callable[[int], bytes | None],
    skip: Callable[[int], None],
    task: Callable[[int], bytes],
    flags: Callable[[int], bytes] | None,
    fallback: Callable[[int, bytes, int, int, int], bytes],
    check: Callable[[int, bytes], object],
    write: Callable[[bytes], object],
    in_ns: bool,
    lost_lines: bool,
) -> tuple[int, int]: ...
