"""C's integer types and conversions, as a `print fmt` expression needs them: the types a
`format` file or a cast names (`unsigned long`, `u32`, `pid_t`), promotion, the usual
arithmetic conversions, two's-complement wrapping, and division that truncates like C's."""

from __future__ import annotations

from dataclasses import dataclass

from probescope.errors import RingBufferFormatError
from probescope.traceevent.format import FormatField

MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class CType:
    """The C type of a compiled expression.

    `int`: an integer of `size` bytes (a `bool` when `boolean`), held in Python as its value;
    `ptr`: a kernel address (unsigned long) that cannot be dereferenced here; `str`: a `char *`
    into the record or a literal, held as `str`; `buf`: a pointer into the record whose bytes
    are known, held as `bytes`, `elem` being the element type; `array`: an integer array field,
    held as a tuple, decaying to `buf`.
    """

    kind: str
    size: int = 0
    signed: bool = False
    boolean: bool = False
    elem: CType | None = None
    count: int = 0

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    @property
    def is_scalar(self) -> bool:
        return self.kind in ("int", "ptr")

    def describe(self) -> str:
        if self.kind == "int":
            if self.boolean:
                return "bool"
            return f"{'s' if self.signed else 'u'}{self.size * 8}"
        return self.kind


def int_type(size: int, signed: bool) -> CType:
    """The integer of `size` bytes and that signedness."""
    return CType("int", size, signed)


INT = int_type(4, True)
UINT = int_type(4, False)
LONG = int_type(8, True)
ULONG = int_type(8, False)
BOOL = CType("int", 1, False, boolean=True)
PTR = CType("ptr", 8, False)
STR = CType("str")
U8 = int_type(1, False)
CHAR = int_type(1, True)

BASE_TYPES: dict[str, CType] = {
    "char": CHAR,
    "signed char": CHAR,
    "unsigned char": U8,
    "short": int_type(2, True),
    "short int": int_type(2, True),
    "signed short": int_type(2, True),
    "unsigned short": int_type(2, False),
    "unsigned short int": int_type(2, False),
    "int": INT,
    "signed": INT,
    "signed int": INT,
    "unsigned": UINT,
    "unsigned int": UINT,
    "uint": UINT,
    "long": LONG,
    "long int": LONG,
    "signed long": LONG,
    "unsigned long": ULONG,
    "unsigned long int": ULONG,
    "ulong": ULONG,
    "long long": LONG,
    "long long int": LONG,
    "signed long long": LONG,
    "unsigned long long": ULONG,
    "unsigned long long int": ULONG,
    "_Bool": BOOL,
    "bool": BOOL,
}
for _bits in (8, 16, 32, 64):
    for _prefix, _signed in (("u", False), ("s", True), ("__u", False), ("__s", True)):
        BASE_TYPES[f"{_prefix}{_bits}"] = int_type(_bits // 8, _signed)
    BASE_TYPES[f"uint{_bits}_t"] = int_type(_bits // 8, False)
    BASE_TYPES[f"int{_bits}_t"] = int_type(_bits // 8, True)
    BASE_TYPES[f"u_int{_bits}_t"] = int_type(_bits // 8, False)
    for _endian in ("le", "be"):
        BASE_TYPES[f"__{_endian}{_bits}"] = int_type(_bits // 8, False)
BASE_TYPES.update(
    {
        "size_t": ULONG,
        "ssize_t": LONG,
        "ptrdiff_t": LONG,
        "uintptr_t": ULONG,
        "intptr_t": LONG,
        "pid_t": INT,
        "uid_t": UINT,
        "gid_t": UINT,
        "dev_t": UINT,
        "loff_t": LONG,
        "off_t": LONG,
        "sector_t": ULONG,
        "blkcnt_t": ULONG,
        "gfp_t": UINT,
        "ino_t": ULONG,
        "umode_t": int_type(2, False),
        "fmode_t": UINT,
        "blk_opf_t": UINT,
        "blk_status_t": U8,
        "phys_addr_t": ULONG,
        "dma_addr_t": ULONG,
        "time64_t": LONG,
        "ktime_t": LONG,
        "clockid_t": INT,
        "xfs_ino_t": ULONG,
        "pgoff_t": ULONG,
        "vm_fault_t": UINT,
        "netdev_features_t": ULONG,
    }
)
TYPE_WORDS = frozenset(
    {"const", "volatile", "signed", "unsigned", "short", "long", "int", "char", "void"}
)


def wrap(source: str, ctype: CType) -> str:
    """Python that reduces an unbounded integer to `ctype`'s range (two's complement)."""
    bits = ctype.size * 8
    mask = (1 << bits) - 1
    if not ctype.signed:
        return f"(({source}) & {mask:#x})"
    half = 1 << (bits - 1)
    return f"(((({source}) + {half:#x}) & {mask:#x}) - {half:#x})"


def wrap_value(value: int, ctype: CType) -> int:
    """`value` converted to `ctype` as C converts an integer (two's complement)."""
    bits = ctype.size * 8
    value &= (1 << bits) - 1
    if ctype.signed and value >> (bits - 1):
        value -= 1 << bits
    return value


def promote(ctype: CType) -> CType:
    """C's integer promotion (pointers count as unsigned long)."""
    if ctype.kind == "ptr":
        return ULONG
    if ctype.boolean or ctype.size < 4:
        return INT
    return ctype


def common_type(left: CType, right: CType) -> CType:
    """C's usual arithmetic conversions of two integer operands."""
    left, right = promote(left), promote(right)
    if left == right:
        return left
    if left.signed == right.signed:
        return left if left.size >= right.size else right
    unsigned, signed = (left, right) if not left.signed else (right, left)
    if unsigned.size >= signed.size:
        return unsigned
    return signed


def c_divide(left: int, right: int) -> int:
    """C's `/` on integers: truncates towards zero."""
    if right == 0:
        raise RingBufferFormatError("print fmt divides by zero for this record")
    quotient = abs(left) // abs(right)
    return quotient if (left < 0) == (right < 0) else -quotient


def c_modulo(left: int, right: int) -> int:
    """C's `%` on integers: the sign of the dividend."""
    return left - right * c_divide(left, right)


def parse_element_type(type_text: str) -> CType | None:
    """The C type an element type of a `format` field names (`u8`, `char *`), if known."""
    words = [w for w in type_text.replace("*", " * ").split() if w not in ("const", "volatile")]
    if "*" in words:
        return PTR
    return BASE_TYPES.get(" ".join(words))


def field_element_type(found: FormatField) -> CType | None:
    """The C type of a scalar field or of one array element, from size and signedness."""
    text = found.element_type if found.is_dynamic else found.type
    if "*" in text:
        return PTR
    words = [w for w in text.split() if w not in ("const", "volatile")]
    length = found.array_length or 0
    size = found.size // length if found.is_array and length else found.size
    if size not in (1, 2, 4, 8):
        return None
    if words and words[0] in ("struct", "union"):
        return None
    if " ".join(words) in ("bool", "_Bool"):
        return CType("int", size, False, boolean=True)
    return int_type(size, found.signed)
