/* Probe sites on every instruction class the engine must displace: RIP-relative loads and
 * stores, call/jmp/jcc/loop/jrcxz, ret, push, nop, endbr64, indirect calls through a register
 * and through memory. Each site is a global label so tests find its file offset in .symtab. */
#include <stdio.h>

long global_value = 40;
long bump(long x) { return x + 1; }
long (*bump_ptr)(long) = bump;

long riprel_load(long x);
void riprel_store(long x);
long call_rel(long x);
long jcc_fn(long x);
long jcc_near_fn(long x);
long loop_fn(long n);
long jrcxz_fn(long n);
long jmp_fn(void);
long ret_fn(void);
long push_fn(long x);
long nop_fn(long x);
long endbr_fn(long x);
long icall_reg(long x);
long icall_mem(long x);
long lea_fn(void);

__asm__(
    ".text\n"
    ".globl riprel_load\n.type riprel_load,@function\nriprel_load:\n"
    ".globl site_riprel_load\nsite_riprel_load:\n"
    "  mov global_value(%rip), %rax\n"
    "  add %rdi, %rax\n"
    "  ret\n"
    ".globl riprel_store\n.type riprel_store,@function\nriprel_store:\n"
    ".globl site_riprel_store\nsite_riprel_store:\n"
    "  mov %rdi, global_value(%rip)\n"
    "  ret\n"
    ".globl call_rel\n.type call_rel,@function\ncall_rel:\n"
    "  push %rbx\n"
    ".globl site_call\nsite_call:\n"
    "  call bump\n"
    "  pop %rbx\n"
    "  ret\n"
    ".globl jcc_fn\n.type jcc_fn,@function\njcc_fn:\n"
    "  cmp $10, %rdi\n"
    ".globl site_jcc\nsite_jcc:\n"
    "  jl 1f\n"
    "  mov $1, %eax\n"
    "  ret\n"
    "1: mov $2, %eax\n"
    "  ret\n"
    ".globl jcc_near_fn\n.type jcc_near_fn,@function\njcc_near_fn:\n"
    "  test %rdi, %rdi\n"
    ".globl site_jcc_near\nsite_jcc_near:\n"
    "  jz.d32 2f\n"
    "  mov $3, %eax\n"
    "  ret\n"
    "2: mov $4, %eax\n"
    "  ret\n"
    ".globl loop_fn\n.type loop_fn,@function\nloop_fn:\n"
    "  mov %rdi, %rcx\n"
    "  xor %eax, %eax\n"
    "3: add $1, %rax\n"
    ".globl site_loop\nsite_loop:\n"
    "  loop 3b\n"
    "  ret\n"
    ".globl jrcxz_fn\n.type jrcxz_fn,@function\njrcxz_fn:\n"
    "  mov %rdi, %rcx\n"
    "  mov $11, %eax\n"
    ".globl site_jrcxz\nsite_jrcxz:\n"
    "  jrcxz 4f\n"
    "  mov $12, %eax\n"
    "4: ret\n"
    ".globl jmp_fn\n.type jmp_fn,@function\njmp_fn:\n"
    ".globl site_jmp\nsite_jmp:\n"
    "  jmp 5f\n"
    "  ud2\n"
    "5: mov $5, %eax\n"
    "  ret\n"
    ".globl ret_fn\n.type ret_fn,@function\nret_fn:\n"
    "  mov $7, %eax\n"
    ".globl site_ret\nsite_ret:\n"
    "  ret\n"
    ".globl push_fn\n.type push_fn,@function\npush_fn:\n"
    ".globl site_push\nsite_push:\n"
    "  push %r12\n"
    "  mov %rdi, %r12\n"
    "  lea 1(%r12), %rax\n"
    "  pop %r12\n"
    "  ret\n"
    ".globl nop_fn\n.type nop_fn,@function\nnop_fn:\n"
    ".globl site_nop\nsite_nop:\n"
    "  nopl 0(%rax,%rax,1)\n"
    "  lea 2(%rdi), %rax\n"
    "  ret\n"
    ".globl endbr_fn\n.type endbr_fn,@function\nendbr_fn:\n"
    ".globl site_endbr\nsite_endbr:\n"
    "  endbr64\n"
    "  lea 3(%rdi), %rax\n"
    "  ret\n"
    ".globl icall_reg\n.type icall_reg,@function\nicall_reg:\n"
    "  push %rbx\n"
    "  lea bump(%rip), %rax\n"
    ".globl site_icall_reg\nsite_icall_reg:\n"
    "  call *%rax\n"
    "  pop %rbx\n"
    "  ret\n"
    ".globl icall_mem\n.type icall_mem,@function\nicall_mem:\n"
    "  push %rbx\n"
    ".globl site_icall_mem\nsite_icall_mem:\n"
    "  call *bump_ptr(%rip)\n"
    "  pop %rbx\n"
    "  ret\n"
    ".globl lea_fn\n.type lea_fn,@function\nlea_fn:\n"
    ".globl site_lea\nsite_lea:\n"
    "  lea global_value(%rip), %rax\n"
    "  mov (%rax), %rax\n"
    "  ret\n");

int main(void)
{
    long acc = 0;
    for (long i = 0; i < 12; i++) {
        acc += riprel_load(i);
        riprel_store(global_value + 1);
        acc += call_rel(i) + jcc_fn(i) + jcc_near_fn(i % 2) + loop_fn(i + 1) + jrcxz_fn(i % 2);
        acc += jmp_fn() + ret_fn() + push_fn(i) + nop_fn(i) + endbr_fn(i);
        acc += icall_reg(i) + icall_mem(i) + lea_fn();
    }
    printf("acc=%ld global=%ld\n", acc, global_value);
    return 0;
}
