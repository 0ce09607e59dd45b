"""The helpers a TP_printk may call (include/trace/stages/stage3_trace_output.h), compiled:
`__get_str`, `__get_dynamic_array` and their `__rel_` forms, bitmasks and cpumasks,
`__print_flags`, `__print_symbolic`, `__print_hex`, `__print_array`, the nanosecond splitters
and `__builtin_expect`. Each is a `call<name>` method that the expression compiler dispatches
calls to; anything else called is kernel code and refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from probescope.traceevent.c_expression import CNode
from probescope.traceevent.c_types import (
    INT,
    STR,
    U8,
    UINT,
    ULONG,
    CType,
    parse_element_type,
    wrap_value,
)
from probescope.traceevent.expression_compiler import (
    Code,
    ExpressionCompiler,
    Unsupported,
    shorten,
)


class TraceOutputCompiler(ExpressionCompiler):
    """The expression compiler with the trace output helpers a print fmt calls."""

    def call__get_str(self, node: CNode) -> Code:
        found, source = self.dynamic_field(node, node.value)
        if not found.element_type.endswith("char"):
            raise Unsupported(f"{node.text!r}: __get_str of a {found.type!r} field")
        text = f"_pf_cstring({source})"
        return Code(text, STR, text_source=text)

    call__get_rel_str = call__get_str

    def call__get_dynamic_array(self, node: CNode) -> Code:
        found, source = self.dynamic_field(node, node.value)
        element = parse_element_type(found.element_type)
        if found.element_type.endswith("char"):
            return Code(
                f"_pf_string_bytes({source})",
                CType("buf", 0, elem=element or U8),
                text_source=f"_pf_cstring({source})",
                lossy=f"the decoder keeps {found.name!r} ({found.type}) as text without its "
                "last byte",
            )
        return Code(source, CType("buf", 0, elem=element or U8))

    call__get_rel_dynamic_array = call__get_dynamic_array
    call__get_sockaddr = call__get_dynamic_array
    call__get_rel_sockaddr = call__get_dynamic_array

    def call__get_dynamic_array_len(self, node: CNode) -> Code:
        _, source = self.dynamic_field(node, node.value)
        return Code(f"_pf_dynamic_length({source})", UINT)

    call__get_rel_dynamic_array_len = call__get_dynamic_array_len

    def call__get_bitmask(self, node: CNode) -> Code:
        _, source = self.dynamic_field(node, node.value)
        return Code(f"_pf_bitmask({source})", STR)

    call__get_cpumask = call__get_bitmask
    call__get_rel_bitmask = call__get_bitmask
    call__get_rel_cpumask = call__get_bitmask

    def call__print_flags(self, node: CNode) -> Code:
        if len(node.children) < 2:
            raise Unsupported(f"{shorten(node.text)!r}: __print_flags needs value, delimiter")
        value = self.convert(self.expr(node.children[0]), ULONG, node)
        delimiter = self.expr(node.children[1])
        if not delimiter.is_constant or delimiter.type.kind not in ("str", "int", "ptr"):
            raise Unsupported(f"{shorten(node.text)!r}: delimiter is not a string literal")
        separator = delimiter.constant if delimiter.type.kind == "str" else None
        if separator is None and delimiter.constant != 0:
            raise Unsupported(f"{shorten(node.text)!r}: delimiter is not a string")
        table = tuple(self.flag_table(node.children[2:], node))
        name = self.helper(table, "flags")
        return self.fold(f"_pf_flags({value.source}, {separator!r}, {name})", STR, value)

    call__print_flags_u64 = call__print_flags

    def call__print_symbolic(self, node: CNode) -> Code:
        if not node.children:
            raise Unsupported(f"{shorten(node.text)!r}: __print_symbolic needs a value")
        value = self.convert(self.expr(node.children[0]), ULONG, node)
        symbols: dict[int, str] = {}
        for mask, label in self.flag_table(node.children[1:], node):
            symbols.setdefault(mask, label)
        name = self.helper(symbols, "symbols")
        return self.fold(f"_pf_symbolic({value.source}, {name})", STR, value)

    call__print_symbolic_u64 = call__print_symbolic

    def flag_table(self, items: Sequence[CNode], node: CNode) -> Iterable[tuple[int, str]]:
        for item in items:
            if item.kind == "braces" and not item.children:
                return
            if item.kind != "braces" or len(item.children) != 2:
                raise Unsupported(f'{shorten(item.text)!r}: expected {{ value, "name" }}')
            mask = self.expr(item.children[0])
            label = self.expr(item.children[1])
            if not mask.is_constant or not mask.type.is_scalar:
                raise Unsupported(f"{shorten(item.text)!r}: value is not a constant")
            if label.is_constant and label.type.kind in ("int", "ptr") and label.constant == 0:
                return
            if not label.is_constant or label.type.kind != "str":
                raise Unsupported(f"{shorten(item.text)!r}: name is not a string literal")
            yield wrap_value(mask.constant, ULONG), label.constant

    def call__print_hex(self, node: CNode) -> Code:
        return self.hex_call(node, concatenate=False)

    def call__print_hex_str(self, node: CNode) -> Code:
        return self.hex_call(node, concatenate=True)

    def hex_call(self, node: CNode, *, concatenate: bool) -> Code:
        if len(node.children) != 2:
            raise Unsupported(f"{shorten(node.text)!r}: expected (buffer, length)")
        data = self.exact_buffer(self.expr(node.children[0]), node)
        length = self.convert(self.expr(node.children[1]), INT, node)
        self.may_fail = True
        return Code(f"_pf_print_hex({data.source}, {length.source}, {concatenate})", STR)

    def call__print_array(self, node: CNode) -> Code:
        if len(node.children) != 3:
            raise Unsupported(f"{shorten(node.text)!r}: expected (array, count, el_size)")
        data = self.exact_buffer(self.expr(node.children[0]), node)
        count = self.convert(self.expr(node.children[1]), INT, node)
        size = self.expr(node.children[2])
        if not size.is_constant or size.constant not in (1, 2, 4, 8):
            raise Unsupported(f"{shorten(node.text)!r}: element size is not 1, 2, 4 or 8")
        self.may_fail = True
        return Code(f"_pf_print_array({data.source}, {count.source}, {size.constant})", STR)

    def call__print_dynamic_array(self, node: CNode) -> Code:
        if len(node.children) != 2 or node.children[0].kind != "ident":
            raise Unsupported(f"{shorten(node.text)!r}: expected (field, el_size)")
        found, source = self.dynamic_field(
            CNode("call", "x", node.children[:1], node.text), "__get"
        )
        if found.element_type.endswith("char"):
            raise Unsupported(
                f"{shorten(node.text)!r} printed as bytes: the decoder keeps {found.name!r} "
                f"({found.type}) as text without its last byte"
            )
        size = self.expr(node.children[1])
        if not size.is_constant or size.constant not in (1, 2, 4, 8):
            raise Unsupported(f"{shorten(node.text)!r}: element size is not 1, 2, 4 or 8")
        count = f"_pf_dynamic_length({source}) // {size.constant}"
        self.may_fail = True
        return Code(f"_pf_print_array({source}, {count}, {size.constant})", STR)

    def call__print_ns_to_secs(self, node: CNode) -> Code:
        value = self.convert(self.single(node), ULONG, node)
        return self.fold(f"({value.source} // 1000000000)", ULONG, value)

    def call__print_ns_without_secs(self, node: CNode) -> Code:
        value = self.convert(self.single(node), ULONG, node)
        return self.fold(f"({value.source} % 1000000000)", UINT, value)

    def call__builtin_expect(self, node: CNode) -> Code:
        if len(node.children) != 2:
            raise Unsupported(f"{node.text!r}: __builtin_expect takes two arguments")
        return self.expr(node.children[0])

    def single(self, node: CNode) -> Code:
        if len(node.children) != 1:
            raise Unsupported(f"{shorten(node.text)!r}: expected one argument")
        return self.expr(node.children[0])
