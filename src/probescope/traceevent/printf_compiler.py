"""A `print fmt`'s printf format lowered into one Python %-template: each conversion of the
kernel's `format_decode` becomes a `%` conversion or a call of the kernel's printing functions
(`vsprintf`), filled by the compiled argument expressions (`expression_compiler`)."""

from __future__ import annotations

from collections.abc import Sequence

from probescope.traceevent.c_expression import CNode
from probescope.traceevent.c_types import INT, ULONG, int_type, promote
from probescope.traceevent.expression_compiler import (
    Code,
    ExpressionCompiler,
    Unsupported,
    shorten,
)
from probescope.traceevent.vsprintf import (
    LEFT,
    PLUS,
    QUALIFIER_SIZE,
    SIGN,
    SMALL,
    SPACE,
    SPECIAL,
    ZEROPAD,
    Conversion,
    decode_format,
)


class _Template:
    """A %-format and the expressions that fill it."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.values: list[str] = []

    def literal(self, text: str) -> None:
        self.parts.append(text.replace("%", "%%"))

    def conversion(self, python_format: str, value: str) -> None:
        self.parts.append(python_format)
        self.values.append(value)

    @property
    def text(self) -> str:
        return "".join(self.parts)


class PrintfCompiler:
    """Lowers each printf conversion of a print fmt, with its arguments, into the template.

    Conversions Python's `%` does the same way (`%d`, `%08x`, `%-5s`...) stay `%`
    conversions; the others call the kernel's `number()`/`string()` and the `%p` extensions
    of `vsprintf`. Problems are collected in the expression compiler's `problems`.
    """

    def __init__(self, compiler: ExpressionCompiler, args: Sequence[CNode]) -> None:
        self.compiler = compiler
        self.args = list(args)
        self.next_arg = 0
        self.template = _Template()

    def take(self, conversion: Conversion) -> tuple[CNode, Code] | None:
        if self.next_arg >= len(self.args):
            self.compiler.problems.append(
                f"{conversion.text!r} has no argument (the print fmt has {len(self.args)})"
            )
            return None
        node = self.args[self.next_arg]
        self.next_arg += 1
        try:
            return node, self.compiler.expr(node)
        except Unsupported as problem:
            self.compiler.problems.append(str(problem))
            return None

    def run(self, text: str) -> None:
        """Lower the whole format `text`, taking arguments in order."""
        for piece in decode_format(text):
            if isinstance(piece, str):
                self.template.literal(piece)
                continue
            if not piece.conversion:
                return
            if piece.conversion == "%":
                self.template.literal("%")
                continue
            try:
                self.lower(piece)
            except Unsupported as problem:
                self.compiler.problems.append(str(problem))

    def star(self, conversion: Conversion) -> str | None:
        taken = self.take(conversion)
        if taken is None:
            return None
        node, code = taken
        return self.compiler.convert(code, INT, node).source

    def lower(self, spec: Conversion) -> None:
        width_source = str(spec.width) if spec.width is not None else self.star(spec)
        precision_source = str(spec.precision) if spec.precision is not None else None
        if spec.precision is None:
            taken_precision = self.star(spec)
            precision_source = None if taken_precision is None else f"max({taken_precision}, 0)"
        taken = self.take(spec)
        if taken is None or width_source is None or precision_source is None:
            return
        node, code = taken
        flags = spec.flags
        if spec.width is None:
            left = f"({flags & LEFT} or {width_source} < 0)"
            width_source = f"abs({width_source})"
            flags_source = f"({flags} | ({LEFT} if {left} else 0))"
        else:
            flags_source = str(flags)
        if spec.conversion == "s":
            self.lower_string(spec, node, code, width_source, precision_source, flags_source)
        elif spec.conversion == "c":
            value = self.compiler.convert(code, promote(code.type), node)
            left = f"bool({flags_source} & {LEFT})"
            if spec.width is not None and spec.width <= 1:
                self.template.conversion("%s", f"_pf_chars[{value.source} & 255]")
            else:
                self.template.conversion("%s", f"_pf_char({value.source}, {width_source}, {left})")
        elif spec.conversion == "p":
            self.lower_pointer(spec, node, code, width_source, precision_source, flags_source)
        else:
            self.lower_number(spec, node, code, width_source, precision_source, flags_source)

    def lower_number(
        self,
        spec: Conversion,
        node: CNode,
        code: Code,
        width: str,
        precision: str,
        flags: str,
    ) -> None:
        if not code.type.is_scalar:
            raise Unsupported(
                f"{shorten(node.text)!r}: {spec.text} of a {code.type.describe()} (an address "
                "of record data)"
            )
        argument = promote(code.type)
        value = self.compiler.convert(code, argument, node)
        size = QUALIFIER_SIZE[spec.qualifier]
        signed = bool(spec.flags & SIGN)
        target = int_type(size, signed)
        if argument.size < size:
            value = self.compiler.convert(value, int_type(argument.size, False), node)
            value = value._replace(type=int_type(size, False))
        value = self.compiler.convert(value, target, node)
        base = {"o": 8, "x": 16, "X": 16}.get(spec.conversion, 10)
        simple = (
            spec.precision == -1
            and not (spec.flags & SPECIAL and base == 8)
            and not (not signed and spec.flags & (PLUS | SPACE))
        )
        if simple and spec.width is not None:
            letter = {"o": "o", "x": "x", "X": "X"}.get(spec.conversion, "d")
            python = "%" + _python_flags(spec.flags) + (str(spec.width) if spec.width > 0 else "")
            self.template.conversion(python + letter, value.source)
            return
        self.template.conversion(
            "%s", f"_pf_number({value.source}, {base}, {flags}, {width}, {precision})"
        )

    def lower_string(
        self,
        spec: Conversion,
        node: CNode,
        code: Code,
        width: str,
        precision: str,
        flags: str,
    ) -> None:
        text = self.compiler.as_string(code, node)
        if spec.width == -1 and spec.precision == -1:
            if text.is_constant:
                self.template.literal(text.constant)
            else:
                self.template.conversion("%s", text.source)
            return
        left = f"bool({flags} & {LEFT})"
        self.template.conversion("%s", f"_pf_string({text.source}, {width}, {precision}, {left})")

    def lower_pointer(
        self,
        spec: Conversion,
        node: CNode,
        code: Code,
        width: str,
        precision: str,
        flags: str,
    ) -> None:
        extension = spec.extension
        letter = extension[:1]
        left = f"bool({flags} & {LEFT})"
        compiler = self.compiler
        if letter in ("S", "s", "B"):
            if not code.type.is_scalar:
                raise Unsupported(f"{shorten(node.text)!r}: %p{extension} of record data")
            if compiler.symbols is None:
                raise Unsupported(
                    f"%p{extension} of {shorten(node.text)!r} needs the kernel's symbols "
                    "(a KernelContext with the kernel's kallsyms)"
                )
            address = compiler.convert(code, ULONG, node)
            symbols = compiler.helper(compiler.symbols, "kallsyms")
            call = (
                f"{symbols}.symbol({address.source}, offset={letter != 's'}, "
                f"backtrace={letter == 'B'})"
            )
            self.string_piece(spec, call, width, precision, left)
            return
        if letter == "x" or (letter == "" and not compiler.hash_pointers and spec.text == "%p"):
            if not code.type.is_scalar:
                raise Unsupported(f"{shorten(node.text)!r}: %p of record data")
            address = compiler.convert(code, ULONG, node)
            if spec.width == -1 and not spec.flags:
                self.template.conversion("%016x", address.source)
            elif spec.width == -1:
                self.template.conversion(
                    "%s", f"_pf_number({address.source}, 16, {flags} | {SMALL | ZEROPAD}, 16, -1)"
                )
            else:
                self.template.conversion(
                    "%s", f"_pf_number({address.source}, 16, {flags} | {SMALL}, {width}, -1)"
                )
            return
        if letter == "":
            reason = (
                "the instance hashes pointers (options/hash-ptr is on)"
                if compiler.hash_pointers
                else "the kernel hashes %p with flags or a width"
            )
            raise Unsupported(f"%p of {shorten(node.text)!r}: {reason}")
        if letter in ("M", "m", "I", "i", "U", "h", "b"):
            data = compiler.exact_buffer(code, node)
            compiler.may_fail = True
            if letter in ("M", "m"):
                call = f"_pf_mac({data.source}, {extension!r})"
            elif letter in ("I", "i"):
                if extension[1:2] not in ("4", "6", "S"):
                    call = repr(f"(%p{letter}?)")
                else:
                    call = f"_pf_ip({data.source}, {extension!r})"
            elif letter == "U":
                call = f"_pf_uuid({data.source}, {extension!r})"
            elif letter == "h":
                separator = {"C": ":", "D": "-", "N": ""}.get(extension[1:2], " ")
                self.template.conversion(
                    "%s", f"_pf_hex_string({data.source}, {width}, {separator!r})"
                )
                return
            else:
                helper = "_pf_bitmap_list" if extension[1:2] == "l" else "_pf_bitmap"
                self.template.conversion("%s", f"{helper}({data.source}, {width})")
                return
            self.string_piece(spec, call, width, precision, left)
            return
        raise Unsupported(f"%p{extension} of {shorten(node.text)!r} (reads kernel memory or state)")

    def string_piece(
        self, spec: Conversion, call: str, width: str, precision: str, left: str
    ) -> None:
        if spec.width == -1 and spec.precision == -1:
            self.template.conversion("%s", call)
        else:
            self.template.conversion("%s", f"_pf_string({call}, {width}, {precision}, {left})")


def _python_flags(flags: int) -> str:
    return "".join(
        letter
        for bit, letter in ((LEFT, "-"), (PLUS, "+"), (SPACE, " "), (SPECIAL, "#"))
        if flags & bit
    ) + ("0" if flags & ZEROPAD and not flags & LEFT else "")
