"""Numbers of the kernel's BPF and perf ABI (include/uapi/linux/bpf.h, perf_event.h) that the
engine uses: commands, map, program and attach types, helper ids, flags, and the offsets of the
`union bpf_attr` members it fills. One place, so a reader can check them against the header."""

from __future__ import annotations

from enum import IntEnum


class Command(IntEnum):
    """`enum bpf_cmd`."""

    MAP_CREATE = 0
    MAP_LOOKUP_ELEM = 1
    MAP_UPDATE_ELEM = 2
    MAP_DELETE_ELEM = 3
    MAP_GET_NEXT_KEY = 4
    PROG_LOAD = 5
    OBJ_GET_INFO_BY_FD = 15
    BTF_LOAD = 18
    MAP_LOOKUP_BATCH = 24
    LINK_CREATE = 28
    LINK_GET_FD_BY_ID = 30


class MapType(IntEnum):
    """`enum bpf_map_type`."""

    HASH = 1
    ARRAY = 2
    PERCPU_HASH = 5
    PERCPU_ARRAY = 6
    STACK_TRACE = 7
    LRU_HASH = 9
    RINGBUF = 27


class ProgramType(IntEnum):
    """`enum bpf_prog_type`."""

    KPROBE = 2  # kprobes and uprobes: the context is struct pt_regs
    TRACEPOINT = 5  # the context is the trace event's record
    PERF_EVENT = 7
    RAW_TRACEPOINT = 17


class AttachType(IntEnum):
    """`enum bpf_attach_type`."""

    NONE = 0
    PERF_EVENT = 41
    TRACE_KPROBE_MULTI = 42
    TRACE_UPROBE_MULTI = 48
    TRACE_UPROBE_SESSION = 57


class Helper(IntEnum):
    """`enum bpf_func_id`: the helpers the compiler calls."""

    MAP_LOOKUP_ELEM = 1
    MAP_UPDATE_ELEM = 2
    MAP_DELETE_ELEM = 3
    KTIME_GET_NS = 5
    GET_SMP_PROCESSOR_ID = 8
    GET_CURRENT_PID_TGID = 14
    GET_CURRENT_COMM = 16
    GET_STACKID = 27
    GET_STACK = 67
    COPY_FROM_USER = 148  # sleepable programs only: may fault pages in
    PROBE_READ_USER = 112
    PROBE_READ_KERNEL = 113
    PROBE_READ_USER_STR = 114
    PROBE_READ_KERNEL_STR = 115
    KTIME_GET_BOOT_NS = 125
    RINGBUF_OUTPUT = 130
    RINGBUF_RESERVE = 131
    RINGBUF_SUBMIT = 132
    RINGBUF_DISCARD = 133
    RINGBUF_QUERY = 134
    GET_FUNC_IP = 173
    GET_ATTACH_COOKIE = 174
    LOOP = 181
    RINGBUF_RESERVE_DYNPTR = 198
    RINGBUF_SUBMIT_DYNPTR = 199
    RINGBUF_DISCARD_DYNPTR = 200
    DYNPTR_WRITE = 202


# Flags
BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2
BPF_F_NO_PREALLOC = 1
BPF_F_USER_STACK = 1 << 8
BPF_RB_NO_WAKEUP = 1
BPF_RB_FORCE_WAKEUP = 2
BPF_RB_AVAIL_DATA = 0
BPF_F_UPROBE_MULTI_RETURN = 1
BPF_PSEUDO_MAP_FD = 1
BPF_PSEUDO_MAP_VALUE = 2
BPF_PSEUDO_FUNC = 4
BPF_OBJ_NAME_LEN = 16
BPF_F_SLEEPABLE = 1 << 4  # prog_flags: the program may sleep (fault user pages in)

# struct bpf_ringbuf_hdr: u32 len (with the two flag bits below), u32 pg_off
RINGBUF_HEADER_SIZE = 8
RINGBUF_BUSY_BIT = 1 << 31
RINGBUF_DISCARD_BIT = 1 << 30

# union bpf_attr: its size on 6.x, and the offsets of the members filled here
BPF_ATTR_SIZE = 168


class MapCreateAttr:
    MAP_TYPE = 0
    KEY_SIZE = 4
    VALUE_SIZE = 8
    MAX_ENTRIES = 12
    MAP_FLAGS = 16
    MAP_NAME = 28


class MapElemAttr:
    MAP_FD = 0
    KEY = 8
    VALUE = 16  # also next_key
    FLAGS = 24


class ProgLoadAttr:
    PROG_TYPE = 0
    INSN_CNT = 4
    INSNS = 8
    LICENSE = 16
    LOG_LEVEL = 24
    LOG_SIZE = 28
    LOG_BUF = 32
    KERN_VERSION = 40
    PROG_FLAGS = 44
    PROG_NAME = 48
    EXPECTED_ATTACH_TYPE = 68
    PROG_BTF_FD = 72
    FUNC_INFO_REC_SIZE = 76
    FUNC_INFO = 80
    FUNC_INFO_CNT = 88


class LinkCreateAttr:
    PROG_FD = 0
    TARGET_FD = 4
    ATTACH_TYPE = 8
    FLAGS = 12
    PERF_EVENT_BPF_COOKIE = 16
    UPROBE_MULTI_PATH = 16
    UPROBE_MULTI_OFFSETS = 24
    UPROBE_MULTI_REF_CTR_OFFSETS = 32
    UPROBE_MULTI_COOKIES = 40
    UPROBE_MULTI_CNT = 48
    UPROBE_MULTI_FLAGS = 52
    UPROBE_MULTI_PID = 56


class BatchAttr:
    IN_BATCH = 0
    OUT_BATCH = 8
    KEYS = 16
    VALUES = 24
    COUNT = 32
    MAP_FD = 36
    ELEM_FLAGS = 40
    FLAGS = 48


# perf_event_open(2)
PERF_TYPE_TRACEPOINT = 2
PERF_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER8 as of 6.x; the kernel accepts smaller known sizes
PERF_SAMPLE_RAW = 1 << 10
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_SET_BPF = 0x40042408


class PerfAttr:
    TYPE = 0
    SIZE = 4
    CONFIG = 8
    SAMPLE_PERIOD = 16
    SAMPLE_TYPE = 24
    FLAGS = 40  # disabled:1, inherit:1, ...
    WAKEUP_EVENTS = 48
    CONFIG1 = 56  # uprobe_path for the uprobe PMU
    CONFIG2 = 64  # probe_offset for the uprobe PMU


SYSCALL_NUMBERS = {
    "x86_64": {"bpf": 321, "perf_event_open": 298},
    "aarch64": {"bpf": 280, "perf_event_open": 241},
}
