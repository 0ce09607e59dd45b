"""Typed C expressions of a `print fmt` compiled to Python expressions over an `Event`.

Each argument of a TP_printk becomes Python source that computes, from the Event's fields, the
value the kernel passed to its printf — with C's integer types, promotions and wrapping, casts,
`?:`, and record data (char arrays, `__data_loc` strings and arrays) as text or bytes. Constant
parts fold at compile time. What needs kernel memory or code (dereferences, kernel functions
and variables, unresolved enum names) is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from probescope.errors import RingBufferFormatError
from probescope.events import Event
from probescope.traceevent.c_expression import CNode
from probescope.traceevent.c_types import (
    BASE_TYPES,
    BOOL,
    CHAR,
    INT,
    LONG,
    PTR,
    STR,
    U8,
    UINT,
    ULONG,
    CType,
    c_divide,
    c_modulo,
    common_type,
    field_element_type,
    int_type,
    promote,
    wrap,
    wrap_value,
)
from probescope.traceevent.context import KernelContext
from probescope.traceevent.format import EventFormat, FormatField
from probescope.traceevent.vsprintf import RUNTIME

_TID = Event._fields.index("tid")
_ARGS = Event._fields.index("args")
_FLAGS = Event._fields.index("flags")
_PREEMPT_COUNT = Event._fields.index("preempt_count")


class Code(NamedTuple):
    """A compiled expression: Python `source` over `e` (the Event), its C `type`, and its value
    when it is a constant the compiler could fold."""

    source: str
    type: CType
    constant: Any = None
    is_constant: bool = False
    text_source: str | None = None  # for a `buf` that is also a decoded string: that string
    lossy: str = ""  # why these bytes may differ from the record's (decoded strings)


class Unsupported(RingBufferFormatError):
    """One problem in one argument; the print fmt compiler collects them into a
    `PrintFmtError` that lists every one."""


class ExpressionCompiler:
    """Compiles the C expressions of one event's print fmt into Python over its Events.

    `arg_names` say where each `format` field is among the Event's `args`. Named constants,
    tables and the kernel's symbols the code needs are collected in `helpers`; problems that
    make an argument impossible to reproduce raise `Unsupported`; `may_fail` is set when the
    code may meet a record it cannot print. Calls of the trace output helpers (`__get_str`,
    `__print_flags`...) are `call<name>` methods of a subclass (`TraceOutputCompiler`).
    """

    def __init__(
        self,
        event_format: EventFormat,
        arg_names: Sequence[str],
        context: KernelContext,
    ) -> None:
        self.format = event_format
        self.context = context
        self.symbols = context.symbols
        self.hash_pointers = context.hash_pointers
        self.problems: list[str] = []
        self.helpers: dict[str, Any] = {}
        self.may_fail = False
        self.positions = {name: index for index, name in enumerate(arg_names)}
        self.fields = {f.name: f for f in event_format.all_fields}

    # -- naming constants ---------------------------------------------------------------------

    def helper(self, value: Any, stem: str) -> str:
        """The name generated code uses for `value` (a table, a constant, the symbols)."""
        name = f"_pf_{stem}{len(self.helpers)}"
        self.helpers[name] = value
        return name

    # -- fields -------------------------------------------------------------------------------

    def field_code(self, name: str, node: CNode) -> Code:
        found = self.fields.get(name)
        if found is None:
            raise Unsupported(f"{node.text!r}: the event has no field {name!r}")
        if name == "common_pid":
            return Code(f"e[{_TID}]", int_type(found.size, found.signed))
        if name == "common_flags":
            return Code(f"e[{_FLAGS}]", int_type(found.size, False))
        if name == "common_preempt_count":
            return Code(f"e[{_PREEMPT_COUNT}]", int_type(found.size, False))
        if name == "common_type":
            return Code(str(self.format.id), int_type(2, False), self.format.id, True)
        if name not in self.positions:
            raise Unsupported(f"{node.text!r}: field {name!r} is not among the event's values")
        source = f"e[{_ARGS}][{self.positions[name]}]"
        if found.is_dynamic:
            raise Unsupported(
                f"{node.text!r}: the raw __data_loc word of {name!r} (use __get_str or "
                "__get_dynamic_array)"
            )
        element = field_element_type(found)
        if found.is_array:
            length = found.array_length or 0
            if found.element_type.endswith("char"):
                return Code(source, CType("str", found.size, elem=CHAR), text_source=source)
            if element is not None and length and found.size == element.size * length:
                return Code(source, CType("array", found.size, elem=element, count=length))
            return Code(source, CType("buf", found.size, elem=U8))
        if element is None:
            return Code(source, CType("buf", found.size, elem=U8))
        return Code(source, element)

    def dynamic_field(self, node: CNode, helper: str) -> tuple[FormatField, str]:
        if len(node.children) != 1 or node.children[0].kind != "ident":
            raise Unsupported(f"{node.text!r}: {helper} takes a field name")
        name = node.children[0].value
        found = self.fields.get(name)
        if found is None:
            raise Unsupported(f"{node.text!r}: the event has no field {name!r}")
        if not found.is_dynamic:
            raise Unsupported(f"{node.text!r}: field {name!r} is not a __data_loc/__rel_loc")
        relative = helper.startswith("__get_rel")
        if relative != found.is_rel_loc:
            raise Unsupported(f"{node.text!r}: {helper} of a field declared {found.type!r}")
        if name not in self.positions:
            raise Unsupported(f"{node.text!r}: field {name!r} is not among the event's values")
        return found, f"e[{_ARGS}][{self.positions[name]}]"

    # -- expressions --------------------------------------------------------------------------

    def expr(self, node: CNode) -> Code:
        method = getattr(self, f"expr_{node.kind}")
        code: Code = method(node)
        return code

    def constant(self, value: Any, ctype: CType) -> Code:
        if ctype.kind in ("int", "ptr"):
            value = wrap_value(int(value), ctype if ctype.kind == "int" else ULONG)
        return Code(repr(value), ctype, value, True)

    def expr_num(self, node: CNode) -> Code:
        value, base, suffix = node.value
        if suffix == "char":
            return self.constant(value if value < 128 else value - 256, INT)
        unsigned = "u" in suffix
        longs = suffix.count("l")
        if longs:
            ctype = ULONG if unsigned or value >> 63 else LONG
        elif unsigned:
            ctype = UINT if value >> 32 == 0 else ULONG
        elif value < 1 << 31:
            ctype = INT
        elif base != 10 and value < 1 << 32:
            ctype = UINT
        elif value < 1 << 63:
            ctype = LONG
        else:
            ctype = ULONG
        return self.constant(value, ctype)

    def expr_str(self, node: CNode) -> Code:
        text = node.value.decode("utf-8", "surrogateescape").partition("\0")[0]
        return Code(repr(text), STR, text, True)

    def expr_ident(self, node: CNode) -> Code:
        name = node.value
        value = self.context.enum_value(name)
        if value is not None:
            return self.constant(value, INT if -(1 << 31) <= value < 1 << 31 else LONG)
        if name in ("true", "false"):
            return self.constant(int(name == "true"), BOOL)
        if name == "REC":
            raise Unsupported(f"{node.text!r}: the record itself")
        raise Unsupported(
            f"identifier {name!r} (a kernel variable, macro or enum the kernel did not resolve "
            "with TRACE_DEFINE_ENUM)"
        )

    def expr_field(self, node: CNode) -> Code:
        return self.field_code(node.value, node)

    def expr_stmt(self, node: CNode) -> Code:
        raise Unsupported(f"GNU statement expression {shorten(node.text)!r}")

    def expr_deref(self, node: CNode) -> Code:
        raise Unsupported(f"{node.text!r}: dereference")

    def expr_braces(self, node: CNode) -> Code:
        raise Unsupported(f"{shorten(node.text)!r}: an initializer list outside __print_*")

    def expr_sizeof(self, node: CNode) -> Code:
        ctype = self.cast_type(node.value, node)
        if ctype.kind == "int":
            return self.constant(ctype.size, ULONG)
        if ctype.kind == "ptr":
            return self.constant(8, ULONG)
        raise Unsupported(f"{node.text!r}: size of {node.value!r}")

    def expr_sizeof_expr(self, node: CNode) -> Code:
        operand = node.children[0]
        if operand.kind == "field" and operand.value in self.fields:
            return self.constant(self.fields[operand.value].size, ULONG)
        raise Unsupported(f"{node.text!r}: sizeof of an expression")

    def expr_addr(self, node: CNode) -> Code:
        operand = node.children[0]
        if operand.kind != "field":
            raise Unsupported(f"{node.text!r}: address of something other than a field")
        code = self.field_code(operand.value, operand)
        if code.type.kind in ("buf",):
            return code
        return self.as_buffer(code, node)

    def expr_index(self, node: CNode) -> Code:
        base = self.expr(node.children[0])
        index = self.expr(node.children[1])
        if not index.type.is_int:
            raise Unsupported(f"{node.text!r}: index is not an integer")
        if base.type.kind == "array" and base.type.elem is not None:
            if index.is_constant:
                if not 0 <= index.constant < base.type.count:
                    raise Unsupported(f"{node.text!r}: index out of the array")
                return Code(f"{base.source}[{index.constant}]", base.type.elem)
            return Code(f"{base.source}[{index.source}]", base.type.elem)
        if base.type.kind in ("str", "buf"):
            data = self.exact_buffer(base, node)
            return Code(wrap(f"{data.source}[{index.source}]", CHAR), CHAR)
        raise Unsupported(f"{node.text!r}: indexing a {base.type.describe()}")

    def expr_unary(self, node: CNode) -> Code:
        operand = self.expr(node.children[0])
        op = node.value
        if op == "!":
            truth = self.truth(operand, node)
            return self.fold(f"(0 if {truth} else 1)", INT, operand)
        if not operand.type.is_int:
            raise Unsupported(f"{node.text!r}: {op} of a {operand.type.describe()}")
        ctype = promote(operand.type)
        value = self.convert(operand, ctype, node)
        if op == "+":
            return value
        if op == "-":
            return self.fold(wrap(f"-{value.source}", ctype), ctype, value)
        if ctype.signed:
            return self.fold(f"(~{value.source})", ctype, value)
        return self.fold(f"({value.source} ^ {(1 << ctype.size * 8) - 1:#x})", ctype, value)

    def expr_binary(self, node: CNode) -> Code:
        op = node.value
        left = self.expr(node.children[0])
        right = self.expr(node.children[1])
        if op in ("&&", "||"):
            a, b = self.truth(left, node), self.truth(right, node)
            word = "and" if op == "&&" else "or"
            return self.fold(f"(1 if ({a}) {word} ({b}) else 0)", INT, left, right)
        for side in (left, right):
            if not side.type.is_scalar:
                raise Unsupported(f"{shorten(node.text)!r}: {op} on a {side.type.describe()}")
        if op in ("<<", ">>"):
            ctype = promote(left.type)
            lhs = self.convert(left, ctype, node)
            rhs = self.convert(right, promote(right.type), node)
            if op == "<<":
                return self.fold(wrap(f"({lhs.source} << {rhs.source})", ctype), ctype, lhs, rhs)
            return self.fold(f"({lhs.source} >> {rhs.source})", ctype, lhs, rhs)
        if (left.type.kind == "ptr") != (right.type.kind == "ptr") and op in ("+", "-"):
            raise Unsupported(f"{shorten(node.text)!r}: pointer arithmetic")
        ctype = common_type(left.type, right.type)
        lhs = self.convert(left, ctype, node)
        rhs = self.convert(right, ctype, node)
        if op in ("==", "!=", "<", ">", "<=", ">="):
            return self.fold(f"(1 if {lhs.source} {op} {rhs.source} else 0)", INT, lhs, rhs)
        if op in ("&", "|", "^"):
            return self.fold(f"({lhs.source} {op} {rhs.source})", ctype, lhs, rhs)
        if op in ("+", "-", "*"):
            return self.fold(wrap(f"{lhs.source} {op} {rhs.source}", ctype), ctype, lhs, rhs)
        if op in ("/", "%"):
            if rhs.is_constant and rhs.constant == 0:
                raise Unsupported(f"{shorten(node.text)!r}: division by zero")
            helper = "_pf_cdiv" if op == "/" else "_pf_cmod"
            self.may_fail = True
            self.helpers[helper] = c_divide if op == "/" else c_modulo
            return self.fold(wrap(f"{helper}({lhs.source}, {rhs.source})", ctype), ctype, lhs, rhs)
        raise Unsupported(f"operator {op!r}")

    def expr_cond(self, node: CNode) -> Code:
        condition = self.expr(node.children[0])
        then = self.expr(node.children[1])
        otherwise = self.expr(node.children[2])
        truth = self.truth(condition, node)
        kinds = {then.type.kind, otherwise.type.kind}
        if kinds <= {"int", "ptr"}:
            ctype = PTR if "ptr" in kinds else common_type(then.type, otherwise.type)
            a = self.convert(then, ctype, node)
            b = self.convert(otherwise, ctype, node)
        elif kinds <= {"str", "int", "ptr"}:
            a = self.as_string(then, node)
            b = self.as_string(otherwise, node)
            ctype = STR
        elif kinds <= {"buf", "array", "str"}:
            a = self.as_buffer(then, node)
            b = self.as_buffer(otherwise, node)
            ctype = a.type
        else:
            raise Unsupported(f"{shorten(node.text)!r}: ?: of {sorted(kinds)}")
        if condition.is_constant:
            return a if condition.constant else b
        return Code(f"({a.source} if {truth} else {b.source})", ctype)

    def expr_cast(self, node: CNode) -> Code:
        target = self.cast_type(node.value, node)
        operand = self.expr(node.children[0])
        if target.kind == "void":
            raise Unsupported(f"{node.text!r}: cast to void")
        if target.kind == "ptr":
            if operand.type.kind in ("str", "buf", "array"):
                if target.elem is not None and target.elem.size == 1:
                    return operand
                if operand.type.kind == "str":
                    return operand
                return self.as_buffer(operand, node)
            if operand.type.kind == "ptr":
                return operand._replace(type=target)
            if operand.type.is_int:
                converted = self.convert(operand, ULONG, node)
                return converted._replace(type=target)
        if target.is_int:
            if operand.type.is_scalar:
                return self.convert(operand, target, node)
            raise Unsupported(f"{shorten(node.text)!r}: the address of record data as an integer")
        raise Unsupported(f"{shorten(node.text)!r}: cast to {node.value!r}")

    def cast_type(self, text: str, node: CNode) -> CType:
        words = text.split()
        stars = words.count("*")
        words = [w for w in words if w not in ("*", "const", "volatile")]
        if not words:
            raise Unsupported(f"{node.text!r}: type {text!r}")
        base: CType | None
        if words[0] in ("struct", "union"):
            if not stars:
                raise Unsupported(f"{node.text!r}: cast to {text!r}")
            base = None
        elif words[0] == "enum":
            base = UINT
        elif words == ["void"]:
            base = CType("void")
        else:
            base = BASE_TYPES.get(" ".join(words)) or self.typedef(" ".join(words))
            if base is None:
                raise Unsupported(f"{shorten(node.text)!r}: unknown type {' '.join(words)!r}")
        if stars or base is None:
            element = base if base is not None and base.kind == "int" and stars == 1 else None
            return CType("ptr", 8, False, elem=element)
        return base

    def typedef(self, name: str) -> CType | None:
        """The integer type a typedef of the kernel's BTF names, if the context has it."""
        types = self.context.types
        if types is not None and name in types.typedefs:
            size, signed = types.typedefs[name]
            return int_type(size, signed)
        return None

    def expr_call(self, node: CNode) -> Code:
        name = node.value
        method = getattr(self, f"call{name}", None)
        if method is None:
            raise Unsupported(f"function {name}() (kernel code, not evaluated here)")
        code: Code = method(node)
        return code

    # -- conversions --------------------------------------------------------------------------

    def fold(self, source: str, ctype: CType, *inputs: Code) -> Code:
        if all(i.is_constant for i in inputs):
            namespace = dict(RUNTIME)
            namespace.update(self.helpers)
            namespace["_pf_cdiv"], namespace["_pf_cmod"] = c_divide, c_modulo
            value = eval(source, namespace)
            if ctype.kind == "str":
                return Code(repr(value), ctype, value, True)
            return self.constant(value, ctype)
        return Code(source, ctype)

    def convert(self, code: Code, target: CType, node: CNode) -> Code:
        if code.type.kind == "ptr":
            source_type = ULONG
        elif code.type.is_int:
            source_type = code.type
        else:
            raise Unsupported(
                f"{shorten(node.text)!r}: a {code.type.describe()} used as an integer"
            )
        if target.boolean:
            if source_type.boolean:
                return code._replace(type=target)
            return self.fold(f"(1 if {code.source} else 0)", target, code)
        if source_type == target or (
            source_type.size <= target.size
            and (
                source_type.signed == target.signed
                or (target.signed and source_type.size < target.size)
                or source_type.boolean
            )
        ):
            if code.is_constant:
                return self.constant(code.constant, target)
            return code._replace(type=target)
        if code.is_constant:
            return self.constant(code.constant, target)
        return Code(wrap(code.source, target), target)

    def truth(self, code: Code, node: CNode) -> str:
        if code.type.kind in ("str", "buf", "array"):
            return "True"
        if code.is_constant:
            return "True" if code.constant else "False"
        return code.source

    def as_string(self, code: Code, node: CNode) -> Code:
        if code.type.kind == "str":
            return code
        if code.text_source is not None:
            return Code(code.text_source, STR)
        if code.type.kind == "buf":
            return Code(f"_pf_buffer_string({code.source})", STR)
        if code.type.kind in ("int", "ptr") and code.is_constant and code.constant == 0:
            return Code(repr("(null)"), STR, "(null)", True)
        if code.type.kind in ("int", "ptr") and self.context.strings is not None:
            address = self.convert(code, ULONG, node)
            table = self.helper(self.context.strings, "strings")
            self.may_fail = True
            return Code(f"_pf_kernel_string({address.source}, {table})", STR)
        raise Unsupported(
            f"{shorten(node.text)!r}: %s of a {code.type.describe()} (the kernel reads a "
            "string from kernel memory, which the record does not hold)"
        )

    def as_buffer(self, code: Code, node: CNode) -> Code:
        ctype = code.type
        if ctype.kind == "buf":
            return code
        if ctype.kind == "array" and ctype.elem is not None:
            return Code(
                f"_pf_pack({code.source}, {ctype.elem.size})",
                CType("buf", ctype.size, elem=ctype.elem),
            )
        if ctype.kind == "str":
            return Code(
                f"_pf_string_bytes({code.source}, {ctype.size})",
                CType("buf", ctype.size, elem=CHAR),
                text_source=code.source,
                lossy="the decoder keeps char arrays and strings only up to their first NUL",
            )
        if ctype.kind == "int" and node.kind == "addr":
            size = ctype.size
            return Code(
                f"({code.source} & {(1 << size * 8) - 1:#x}).to_bytes({size}, 'little')",
                CType("buf", size, elem=ctype),
            )
        raise Unsupported(
            f"{shorten(node.text)!r}: a {ctype.describe()} used as a pointer to data (kernel "
            "memory, which the record does not hold)"
        )

    def exact_buffer(self, code: Code, node: CNode) -> Code:
        """`as_buffer` for consumers that print raw bytes: refuses bytes rebuilt from text."""
        data = self.as_buffer(code, node)
        if data.lossy:
            raise Unsupported(f"{shorten(node.text)!r} printed as bytes: {data.lossy}")
        return data


def shorten(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
