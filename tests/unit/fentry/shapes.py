"""Assembly functions of known shapes, built into a shared object, for the site planner."""

from __future__ import annotations

from pathlib import Path

from support.build import compile_program

SHAPES = r"""
__asm__(
"    .text\n"
"    .macro fn name\n"
"    .p2align 4\n"
"    .globl \\name\n"
"    .type \\name, @function\n"
"\\name:\n"
"    .endm\n"
"    .macro end name\n"
"    .size \\name, .-\\name\n"
"    .endm\n"
/* a loop head at +2: the jne lands inside the first 5 bytes */
"    fn loop_head\n"
"    xor %eax, %eax\n"
"1:  inc %eax\n"
"    cmp $10, %eax\n"
"    jne 1b\n"
"    ret\n"
"    end loop_head\n"
/* a jump table */
"    fn jump_table\n"
"    push %rbx\n"
"    mov %rdi, %rbx\n"
"    lea table(%rip), %rax\n"
"    jmp *(%rax,%rdi,8)\n"
"2:  pop %rbx\n"
"    ret\n"
"    end jump_table\n"
/* a call first */
"    fn call_first\n"
"    call helper\n"
"    ret\n"
"    end call_first\n"
"    fn helper\n"
"    ret\n"
"    end helper\n"
/* 3 bytes, then alignment padding: the jump may cover the padding */
"    fn tiny_padded\n"
"    xor %eax, %eax\n"
"    ret\n"
"    end tiny_padded\n"
/* 1 byte, another function right behind it */
"    fn tiny_adjacent\n"
"    ret\n"
"    end tiny_adjacent\n"
"    .globl right_behind\n"
"    .type right_behind, @function\n"
"right_behind:\n"
"    xor %eax, %eax\n"
"    ret\n"
"    end right_behind\n"
/* reads the carry it was called with */
"    fn flags_in\n"
"    adc $0, %eax\n"
"    add $1, %eax\n"
"    ret\n"
"    end flags_in\n"
/* sets the flags it reads: fine */
"    fn flags_own\n"
"    test %edi, %edi\n"
"    je 3f\n"
"    mov $1, %eax\n"
"3:  ret\n"
"    end flags_own\n"
/* a RIP-relative load first */
"    fn riprel\n"
"    mov counter(%rip), %eax\n"
"    add $1, %eax\n"
"    ret\n"
"    end riprel\n"
/* a loop back to the entry itself is not inside the patched bytes */
"    fn back_to_entry\n"
"    dec %edi\n"
"    mov %edi, %eax\n"
"    jnz back_to_entry\n"
"    ret\n"
"    end back_to_entry\n"
/* another symbol starts inside the first 5 bytes */
"    fn symbol_inside\n"
"    nop\n"
"    nop\n"
"    .globl inner_label\n"
"inner_label:\n"
"    mov $7, %eax\n"
"    ret\n"
"    end symbol_inside\n"
/* endbr64 stays, the jump goes after it */
"    fn with_endbr\n"
"    endbr64\n"
"    push %rbp\n"
"    mov %rsp, %rbp\n"
"    mov %edi, %eax\n"
"    pop %rbp\n"
"    ret\n"
"    end with_endbr\n"
/* a .cold part jumping back into the first bytes */
"    fn hot\n"
"    test %edi, %edi\n"
"    je hot.cold\n"
"4:  mov %edi, %eax\n"
"    ret\n"
"    end hot\n"
"    .type hot.cold, @function\n"
"hot.cold:\n"
"    xor %edi, %edi\n"
"    jmp hot+2\n"
"    .size hot.cold, .-hot.cold\n"
"    .pushsection .data\n"
"counter: .long 0\n"
"table: .quad 0\n"
"    .popsection\n"
);
"""

PATCHABLE = """
int patchable(int x) { return x * 3; }
int plain(int x) { return patchable(x) + 1; }
"""


def shapes_library() -> Path:
    return compile_program(SHAPES, "libshapes.so", ("-shared", "-nostdlib", "-fPIC"))


def patchable_library() -> Path:
    return compile_program(
        PATCHABLE, "libpatchable.so", ("-O1", "-shared", "-fPIC", "-fpatchable-function-entry=5")
    )
