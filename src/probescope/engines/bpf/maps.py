"""BPF maps as Python objects: one class per map type the engine (and the in-kernel
aggregations built on it) use, each owning its file descriptor.

Per-CPU maps return one value per *possible* CPU, each padded to 8 bytes, as the kernel lays
them out for user space. Keys and values are bytes here; callers pack them with `struct`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from probescope.engines.bpf import syscall
from probescope.engines.bpf.abi import BPF_ANY, BPF_F_NO_PREALLOC, MapType
from probescope.errors import BpfError


def possible_cpus() -> int:
    """How many CPUs the kernel may ever bring up (per-CPU map values come in this count)."""
    try:
        with open("/sys/devices/system/cpu/possible") as possible:
            text = possible.read().strip()
    except OSError:
        import os

        return os.cpu_count() or 1
    highest = 0
    for part in text.split(","):
        highest = max(highest, int(part.split("-")[-1]))
    return highest + 1


class BpfMap:
    """A map: `fd` is what programs reference (through `ld_map_fd`)."""

    map_type: MapType = MapType.HASH

    def __init__(
        self, name: str, key_size: int, value_size: int, max_entries: int, *, flags: int = 0
    ) -> None:
        self.name = name
        self.key_size = key_size
        self.value_size = value_size
        self.max_entries = max_entries
        self.fd = syscall.map_create(
            self.map_type, key_size, value_size, max_entries, flags=flags, name=name
        )

    def close(self) -> None:
        if self.fd >= 0:
            syscall.close(self.fd)
            self.fd = -1

    def __enter__(self) -> BpfMap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lookup(self, key: bytes) -> bytes | None:
        return syscall.map_lookup(self.fd, key, self._user_value_size)

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        syscall.map_update(self.fd, key, value, flags)

    def delete(self, key: bytes) -> bool:
        return syscall.map_delete(self.fd, key)

    def keys(self) -> Iterator[bytes]:
        key = None
        while True:
            key = syscall.map_next_key(self.fd, key, self.key_size)
            if key is None:
                return
            yield key

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value); read in batches where the kernel can, key by key otherwise."""
        try:
            cursor: bytes | None = None
            while True:
                pairs, cursor = syscall.map_lookup_batch(
                    self.fd, self.key_size, self._user_value_size, 256, cursor
                )
                yield from pairs
                if cursor is None:
                    return
        except BpfError:
            pass
        for key in list(self.keys()):
            value = self.lookup(key)
            if value is not None:
                yield key, value

    @property
    def _user_value_size(self) -> int:
        return self.value_size


class HashMap(BpfMap):
    """BPF_MAP_TYPE_HASH, allocated on demand (no preallocation of max_entries)."""

    map_type = MapType.HASH

    def __init__(self, name: str, key_size: int, value_size: int, max_entries: int) -> None:
        super().__init__(name, key_size, value_size, max_entries, flags=BPF_F_NO_PREALLOC)


class ArrayMap(BpfMap):
    """BPF_MAP_TYPE_ARRAY: u32 keys 0..max_entries-1, values zeroed at creation."""

    map_type = MapType.ARRAY

    def __init__(self, name: str, value_size: int, max_entries: int) -> None:
        super().__init__(name, 4, value_size, max_entries)

    def get(self, index: int) -> bytes:
        value = self.lookup(struct.pack("<I", index))
        if value is None:
            raise BpfError(f"map {self.name!r} has no index {index}")
        return value

    def set(self, index: int, value: bytes) -> None:
        self.update(struct.pack("<I", index), value)


class PercpuArrayMap(ArrayMap):
    """BPF_MAP_TYPE_PERCPU_ARRAY: one value per possible CPU at each index."""

    map_type = MapType.PERCPU_ARRAY

    def __init__(self, name: str, value_size: int, max_entries: int) -> None:
        self.cpus = possible_cpus()
        super().__init__(name, value_size, max_entries)

    @property
    def _user_value_size(self) -> int:
        return _round8(self.value_size) * self.cpus

    def per_cpu(self, index: int) -> list[bytes]:
        """The value of every possible CPU at `index`."""
        raw = self.get(index)
        step = _round8(self.value_size)
        return [raw[cpu * step : cpu * step + self.value_size] for cpu in range(self.cpus)]

    def sum_u64(self, index: int) -> int:
        """The u64 at the start of `index`'s value, summed over CPUs (a per-CPU counter)."""
        return sum(struct.unpack_from("<Q", value)[0] for value in self.per_cpu(index))


class PercpuHashMap(BpfMap):
    """BPF_MAP_TYPE_PERCPU_HASH, allocated on demand: one value per possible CPU per key."""

    map_type = MapType.PERCPU_HASH

    def __init__(self, name: str, key_size: int, value_size: int, max_entries: int) -> None:
        self.cpus = possible_cpus()
        super().__init__(name, key_size, value_size, max_entries, flags=BPF_F_NO_PREALLOC)

    @property
    def _user_value_size(self) -> int:
        return _round8(self.value_size) * self.cpus

    def per_cpu_items(self) -> Iterator[tuple[bytes, list[bytes]]]:
        """Every key with the value of each possible CPU."""
        step = _round8(self.value_size)
        for key, raw in self.items():
            yield key, [raw[cpu * step : cpu * step + self.value_size] for cpu in range(self.cpus)]


class StackTraceMap(BpfMap):
    """BPF_MAP_TYPE_STACK_TRACE: `bpf_get_stackid` stores a stack, keyed by its u32 id, as up
    to `depth` u64 addresses (zero-padded)."""

    map_type = MapType.STACK_TRACE

    def __init__(self, name: str, depth: int, max_entries: int) -> None:
        self.depth = depth
        super().__init__(name, 4, 8 * depth, max_entries)

    def stack(self, stack_id: int) -> tuple[int, ...]:
        value = self.lookup(struct.pack("<I", stack_id))
        if value is None:
            return ()
        addresses = struct.unpack(f"<{self.depth}Q", value)
        return tuple(a for a in addresses if a)


def _round8(size: int) -> int:
    return (size + 7) & ~7
