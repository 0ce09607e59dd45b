# The ptrace engine's dead man's switch (x86-64, GNU as, AT&T syntax).
#
# Never assembled at run time: tools/ptrace_switch_code.py assembles this file with `as` at
# development time into engines/ptrace/dead_mans_switch_code.py (the image's bytes and the
# offsets of its labels and constants); a unit test re-assembles it and compares.
#
# The engine maps one area (read+execute, private, anonymous) per traced address space, copies
# the image to its start and fills the header and the tables through /proc/PID/mem. `handler`
# is installed for SIGTRAP (and SIGSEGV, for the sites that carry `hlt`) only where the
# program left the signal at its default action. While probescope traces, every such
# signal stops the thread for the tracer first and the handler never runs. It runs when
# probescope died without detaching (SIGKILL, OOM): then it
#   - puts the original bytes of every probe site back (through /proc/self/mem, which writes
#     into read-only text as the tracer does), and sends a thread that trapped on one of our
#     bytes back to the probed instruction (or to its XOL slot if the text cannot be written);
#   - sends a thread returning through the trampoline to its real return address, found by
#     the stack slot it was read from (the returns table);
#   - gives a thread caught in an injected system call (its single-step trap) the registers the
#     tracer saved before borrowing it;
#   - gives a thread still pinned to the tracer's CPU its own affinity back;
#   - and lets every other signal have its default action, as it would without us.
# It refers only to itself and its area (RIP-relative), and to areas an earlier probescope
# left in the process (`previous`), so it runs wherever the area is mapped.

        .set SITE_CAPACITY, 32768
        .set SITE_SIZE, 32
        .set SITES_OFFSET, 0x1000
        .set RETURN_CAPACITY, 8192
        .set RETURN_SIZE, 16
        .set RETURNS_OFFSET, SITES_OFFSET + SITE_CAPACITY * SITE_SIZE
        .set AREA_SIZE, RETURNS_OFFSET + RETURN_CAPACITY * RETURN_SIZE
        .set TRAMPOLINE_SIZE, 32
        .set MASK_BYTES, 128
        .set SAVED_GREGS, 18            # REG_R8 .. REG_EFL of mcontext_t

        # a site entry: the probed address, its XOL slot (0: none) and the original bytes
        .set SITE_ADDRESS, 0
        .set SITE_SLOT, 8
        .set SITE_BYTES, 16
        .set SITE_LENGTH, 31            # 1..15; 0 marks a free entry
        # a return entry: the stack slot holding a hijacked return address, and the real one
        .set RETURN_STACK, 0
        .set RETURN_ORIGINAL, 8

        .set INT3, 0xcc
        .set HLT, 0xf4
        .set SIGTRAP, 5
        .set SIGSEGV, 11
        .set SI_KERNEL, 0x80
        .set SI_CODE, 8                 # siginfo_t
        .set UC_GREGS, 40               # ucontext_t: uc_mcontext.gregs
        .set UC_RSP, UC_GREGS + 15 * 8
        .set UC_RIP, UC_GREGS + 16 * 8
        .set SA_SIGINFO, 0x4
        .set SA_RESTART, 0x10000000
        .set SA_RESTORER, 0x04000000
        .set HANDLER_FLAGS, SA_SIGINFO | SA_RESTART | SA_RESTORER
        .set SYS_PREAD64, 17
        .set SYS_PWRITE64, 18
        .set SYS_CLOSE, 3
        .set SYS_RT_SIGACTION, 13
        .set SYS_RT_SIGRETURN, 15
        .set SYS_GETPID, 39
        .set SYS_GETTID, 186
        .set SYS_TGKILL, 234
        .set SYS_OPENAT, 257
        .set SYS_SCHED_SETAFFINITY, 203
        .set SYS_SCHED_GETAFFINITY, 204
        .set AT_FDCWD, -100
        .set O_RDWR_CLOEXEC, 0x80002

        # the handler's frame, below %rbp
        .set F_SIGNAL, -8
        .set F_BYTE, -16
        .set F_FD, -24
        .set F_RESTORED, -32
        .set F_ENTRY, -40
        .set F_MASK, -192               # MASK_BYTES for sched_getaffinity
        .set FRAME, 256

        .globl SITE_CAPACITY, SITE_SIZE, SITES_OFFSET, RETURN_CAPACITY, RETURN_SIZE
        .globl RETURNS_OFFSET, AREA_SIZE, TRAMPOLINE_SIZE, MASK_BYTES, SAVED_GREGS
        .globl SITE_ADDRESS, SITE_SLOT, SITE_BYTES, SITE_LENGTH, RETURN_STACK, RETURN_ORIGINAL
        .globl HANDLER_FLAGS

        .text
        # the labels below are local symbols (a global one would be referenced through a
        # relocation); tools/ptrace_switch_code.py reads their offsets from the symbol table
area:
        .ascii  "probescope ptrace switch\0\0\0\0\0\0\0\0"     # 32 bytes
owner:  .quad   0                       # pid of the probescope that made the area
site_count:
        .quad   0
trampoline:
        .quad   0                       # the return trampoline (TRAMPOLINE_SIZE int3s), or 0
previous:
        .quad   0                       # an area an earlier, killed probescope left, or 0
injection_resume:
        .quad   0                       # ip of the single-step trap after an injected syscall
saved_gregs:
        .fill   SAVED_GREGS, 8, 0       # ... and the registers to resume that thread with
mask_size:
        .quad   0                       # 0: the tracer did not pin threads to a CPU
pinned_mask:
        .fill   MASK_BYTES, 1, 0
original_mask:
        .fill   MASK_BYTES, 1, 0
action: .quad   0, HANDLER_FLAGS, 0, -1 # struct kernel_sigaction: handler, flags, restorer, mask
default_action:
        .quad   0, 0, 0, 0              # SIG_DFL
proc_self_mem:
        .asciz  "/proc/self/mem"

        .balign 16
# handler(int signal, siginfo_t *info, ucontext_t *context); every signal is blocked meanwhile
handler:
        push    %rbp
        mov     %rsp, %rbp
        sub     $FRAME, %rsp
        mov     %edi, F_SIGNAL(%rbp)
        mov     %rsi, %r13              # siginfo
        mov     %rdx, %r14              # ucontext
        lea     area(%rip), %rbx
        mov     UC_RIP(%r14), %r15      # where the thread stopped
        cmp     $SIGTRAP, %edi
        jne     .Lsegv

        # an injected system call, caught by the trap after its single step
        mov     injection_resume(%rip), %rax
        test    %rax, %rax
        jz      .Lint3
        cmp     %rax, %r15
        jne     .Lint3
        lea     saved_gregs(%rip), %rsi
        lea     UC_GREGS(%r14), %rdi
        mov     $SAVED_GREGS, %ecx
        rep movsq
        jmp     .Lours

.Lint3:
        cmpl    $SI_KERNEL, SI_CODE(%r13)
        jne     .Lother_trap
        lea     -1(%r15), %rdi          # the int3 that trapped
        call    find_site
        test    %rax, %rax
        jnz     .Lsite
        lea     -1(%r15), %rdi
        call    in_trampoline
        test    %rax, %rax
        jz      .Lfatal
        mov     UC_RSP(%r14), %rdi      # `ret` popped the hijacked slot: it is just below sp
        sub     $8, %rdi
        call    find_return
        test    %rax, %rax
        jz      .Lfatal
        mov     %rax, UC_RIP(%r14)
        jmp     .Lours

.Lother_trap:
        # single-step, branch and hardware-breakpoint traps: a dead tracer left one behind
        # (a thread it was stepping); the thread goes on as it is
        cmpl    $0, SI_CODE(%r13)
        jg      .Ldone
        jmp     .Lfatal                 # sent by a process: what SIGTRAP does by default

.Lsegv:
        cmp     $SIGSEGV, %edi
        jne     .Lfatal
        cmpl    $SI_KERNEL, SI_CODE(%r13)
        jne     .Lfatal
        mov     %r15, %rdi              # a `hlt` faults before it runs: ip is the site
        call    find_site
        test    %rax, %rax
        jz      .Lfatal
        cmp     SITE_ADDRESS(%rax), %r15
        jne     .Lfatal

.Lsite:
        mov     %rax, F_ENTRY(%rbp)
        call    restore_text
        mov     F_ENTRY(%rbp), %rdx
        test    %rax, %rax
        jz      .Lslot
        mov     SITE_ADDRESS(%rdx), %rax  # every byte of ours is gone: run the original
        mov     %rax, UC_RIP(%r14)
        jmp     .Laffinity
.Lslot:
        mov     SITE_SLOT(%rdx), %rax   # text not writable here: run the displaced copy
        test    %rax, %rax
        jz      .Lfatal
        mov     %rax, UC_RIP(%r14)
        jmp     .Laffinity

.Lours:
        call    restore_text
.Laffinity:
        call    restore_affinity
.Ldone:
        mov     %rbp, %rsp
        pop     %rbp
        ret

.Lfatal:
        # not ours: the default action, as without the switch (a fault raises itself again
        # when its instruction re-runs; a trap or a signal sent by a process is raised again)
        mov     $SYS_RT_SIGACTION, %eax
        mov     F_SIGNAL(%rbp), %edi
        lea     default_action(%rip), %rsi
        xor     %edx, %edx
        mov     $8, %r10d
        syscall
        cmpl    $SIGTRAP, F_SIGNAL(%rbp)
        je      .Lraise
        cmpl    $0, SI_CODE(%r13)
        jg      .Ldone
.Lraise:
        mov     $SYS_GETPID, %eax
        syscall
        mov     %rax, %r12
        mov     $SYS_GETTID, %eax
        syscall
        mov     %rax, %rsi
        mov     %r12, %rdi
        mov     F_SIGNAL(%rbp), %edx
        mov     $SYS_TGKILL, %eax
        syscall
        jmp     .Ldone

# find_site(%rdi = address) -> %rax = the site entry whose instruction covers the address, or 0
find_site:
        mov     %rbx, %rcx
.Lfs_area:
        mov     site_count-area(%rcx), %rdx
        lea     SITES_OFFSET(%rcx), %rax
.Lfs_entry:
        test    %rdx, %rdx
        jz      .Lfs_next_area
        mov     %rdi, %r8
        sub     SITE_ADDRESS(%rax), %r8
        movzbl  SITE_LENGTH(%rax), %r9d
        cmp     %r9, %r8
        jb      .Lfs_found              # 0 <= address - site < length
        add     $SITE_SIZE, %rax
        dec     %rdx
        jmp     .Lfs_entry
.Lfs_next_area:
        mov     previous-area(%rcx), %rcx
        test    %rcx, %rcx
        jnz     .Lfs_area
        xor     %eax, %eax
.Lfs_found:
        ret

# in_trampoline(%rdi = address) -> %rax = 1 when the address is inside a trampoline, else 0
in_trampoline:
        mov     %rbx, %rcx
.Lit_area:
        mov     trampoline-area(%rcx), %rax
        test    %rax, %rax
        jz      .Lit_next_area
        mov     %rdi, %r8
        sub     %rax, %r8
        cmp     $TRAMPOLINE_SIZE, %r8
        jb      .Lit_found
.Lit_next_area:
        mov     previous-area(%rcx), %rcx
        test    %rcx, %rcx
        jnz     .Lit_area
        xor     %eax, %eax
        ret
.Lit_found:
        mov     $1, %eax
        ret

# find_return(%rdi = stack slot) -> %rax = the return address hijacked there, or 0
find_return:
        mov     %rbx, %rcx
.Lfr_area:
        lea     RETURNS_OFFSET(%rcx), %rax
        mov     $RETURN_CAPACITY, %edx
.Lfr_entry:
        cmp     %rdi, RETURN_STACK(%rax)
        je      .Lfr_found
        add     $RETURN_SIZE, %rax
        dec     %edx
        jnz     .Lfr_entry
        mov     previous-area(%rcx), %rcx
        test    %rcx, %rcx
        jnz     .Lfr_area
        xor     %eax, %eax
        ret
.Lfr_found:
        mov     RETURN_ORIGINAL(%rax), %rax
        ret

# restore_text() -> %rax = 1 when no byte of ours is left at any site, else 0
restore_text:
        mov     $SYS_OPENAT, %eax
        mov     $AT_FDCWD, %rdi
        lea     proc_self_mem(%rip), %rsi
        mov     $O_RDWR_CLOEXEC, %edx
        xor     %r10d, %r10d
        syscall
        test    %rax, %rax
        js      .Lrt_failed
        mov     %rax, F_FD(%rbp)
        movq    $1, F_RESTORED(%rbp)
        mov     %rbx, %r12              # area
.Lrt_area:
        xor     %r8d, %r8d              # entry index (the kernel keeps r8, r9 across syscalls)
.Lrt_entry:
        cmp     site_count-area(%r12), %r8
        jae     .Lrt_next_area
        mov     %r8, %r9
        shl     $5, %r9                 # * SITE_SIZE
        lea     SITES_OFFSET(%r12,%r9), %r9
        movzbl  SITE_LENGTH(%r9), %eax
        test    %eax, %eax
        jz      .Lrt_next
        mov     $SYS_PREAD64, %eax
        mov     F_FD(%rbp), %rdi
        lea     F_BYTE(%rbp), %rsi
        mov     $1, %edx
        mov     SITE_ADDRESS(%r9), %r10
        syscall
        cmp     $1, %rax
        jne     .Lrt_next               # unmapped: nothing to put back
        movzbl  F_BYTE(%rbp), %eax
        cmp     $INT3, %eax
        je      .Lrt_write
        cmp     $HLT, %eax
        jne     .Lrt_next
.Lrt_write:
        mov     $SYS_PWRITE64, %eax
        mov     F_FD(%rbp), %rdi
        lea     SITE_BYTES(%r9), %rsi
        movzbl  SITE_LENGTH(%r9), %edx
        mov     SITE_ADDRESS(%r9), %r10
        syscall
        movzbl  SITE_LENGTH(%r9), %edx
        cmp     %rdx, %rax
        je      .Lrt_next
        movq    $0, F_RESTORED(%rbp)
.Lrt_next:
        inc     %r8
        jmp     .Lrt_entry
.Lrt_next_area:
        mov     previous-area(%r12), %r12
        test    %r12, %r12
        jnz     .Lrt_area
        mov     $SYS_CLOSE, %eax
        mov     F_FD(%rbp), %rdi
        syscall
        mov     F_RESTORED(%rbp), %rax
        ret
.Lrt_failed:
        xor     %eax, %eax
        ret

# restore_affinity(): a thread still pinned to the tracer's CPU gets its own CPUs back
restore_affinity:
        mov     mask_size(%rip), %rsi
        test    %rsi, %rsi
        jz      .Lra_done
        lea     F_MASK(%rbp), %rdi
        mov     $MASK_BYTES, %ecx
        xor     %eax, %eax
        rep stosb
        mov     $SYS_SCHED_GETAFFINITY, %eax
        xor     %edi, %edi
        lea     F_MASK(%rbp), %rdx
        syscall
        test    %rax, %rax
        jle     .Lra_done
        lea     F_MASK(%rbp), %rsi
        lea     pinned_mask(%rip), %rdi
        mov     $MASK_BYTES, %ecx
        repe cmpsb
        jne     .Lra_done               # not as the tracer left it: the program's own choice
        mov     $SYS_SCHED_SETAFFINITY, %eax
        xor     %edi, %edi
        mov     mask_size(%rip), %rsi
        lea     original_mask(%rip), %rdx
        syscall
.Lra_done:
        ret

# sa_restorer: back from the handler into the interrupted code
restorer:
        mov     $SYS_RT_SIGRETURN, %eax
        syscall
image_end:
