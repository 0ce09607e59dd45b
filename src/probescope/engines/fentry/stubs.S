# The code the fentry engine injects into a traced program (x86-64, GNU as, AT&T syntax).
#
# Never assembled at run time: tools/fentry_templates.py assembles this file with `as` at
# development time into engines/fentry/templates.py (bytes, symbols, holes); the engine copies
# those bytes into the program's code area and fills the holes; a test re-assembles the source
# and compares. Each section is one template. References to symbols this file does not define
# (header fields of the code area, the site word) are the holes: the assembler leaves them as
# relocations, which the table keeps.
#
# A hit goes: patched site `jmp stub` -> site stub (push %rsi; mov $SITE_WORD, %esi;
# call fentry_common; pop %rsi; displaced instructions; jmp back). fentry_common writes one
# 128-byte record into the shared ring and, for return probes, swaps the return address for
# return_trampoline, keeping the real one on the thread's shadow stack. Every register is
# preserved (callers built with -fipa-ra keep values in call-clobbered registers); the flags
# are not (sites are function entries, where they are dead).

        .set THREADS, 1024              # thread table entries (power of two)
        .set THREAD_BITS, 10
        .set THREAD_ENTRY, 32
        .set MAX_DEPTH, 64              # pending returns per thread, as the kernel's uretprobes
        .set FRAME_SIZE, 32
        .set FRAMES_PER_THREAD_SHIFT, 11    # MAX_DEPTH * FRAME_SIZE = 2048
        .set FRAMES_OFFSET, 0x8000      # THREADS * THREAD_ENTRY
        .set TID_OFFSET, 0x2d0          # glibc's struct pthread: tid (checked at every claim)

        # thread table entry (private memory: a fork child gets its copy, as the kernel copies
        # a task's return instances)
        .set T_TID, 0
        .set T_PID, 4
        .set T_TCB, 8
        .set T_DEPTH, 16
        # shadow stack frame
        .set F_STACK, 0                 # where the return address lives (sp at entry)
        .set F_ORIG, 8                  # the real return address
        .set F_SITE, 16                 # the entry's site word
        .set F_FLAGS, 20
        .set FRAME_CHAINED, 1           # a tail call reusing its caller's hijack
        .set FRAME_EXPOSED, 2           # real return address put back for an unwinder

        # ring header (shared memory, also mapped by the tracer)
        .set RING_MASK, 0x10            # records - 1
        .set RING_RECORDS, 0x18
        .set RING_HEAD, 0x40            # next ticket (producers, lock cmpxchg)
        .set RING_TAIL, 0x80            # next ticket the tracer reads
        .set RING_DROPS, 0xc0           # records lost to a full ring
        .set RING_OMITTED, 0xc8         # return probes omitted beyond MAX_DEPTH
        .set RING_STATE, 0x100          # 1 while a tracer serves requests
        .set RING_LOCK, 0x140           # tid of the thread holding the request slot
        .set RING_REQ_KIND, 0x144
        .set RING_REQ_TID, 0x148
        .set RING_REQ_PID, 0x14c
        .set RING_REQ_SEQ, 0x158
        .set RING_ACK_SEQ, 0x180
        .set RING_DATA, 0x1000
        .set RECORD_SHIFT, 7            # 128-byte records

        # record
        .set REC_COMMIT, 0              # ticket + 1 (low 32 bits), stored last
        .set REC_SITE, 4                # site word; REC_RETURN set for returns
        .set REC_TID, 8
        .set REC_PID, 12
        .set REC_TSC, 16
        .set REC_CPU, 24                # TSC_AUX: node << 12 | cpu
        .set REC_AUX, 32                # returns: the real return address
        .set REC_RDI, 40
        .set REC_RSI, 48
        .set REC_RDX, 56
        .set REC_RCX, 64
        .set REC_R8, 72
        .set REC_R9, 80
        .set REC_RAX, 88
        .set REC_RSP, 96
        .set REC_STACK0, 104
        .set REC_STACK1, 112
        .set REC_STACK2, 120
        .set REC_RETURN, 0x80000000

        # site word flags (bits 24..30; bits 0..23 are the site number)
        .set F_ENTRY, 0x01000000        # record the entry
        .set F_RETURN, 0x02000000       # hook the return
        .set F_EXPOSE, 0x04000000       # the unwinder starts: real return addresses back
        .set F_CATCH, 0x08000000        # an exception was caught: hook survivors again
        .set F_DLOPEN, 0x10000000       # the dynamic linker's rendezvous (r_brk)
        .set F_EXEC, 0x20000000         # an exec is about to replace the image
        .set F_HOOKS, 0x3c000000

        .set SYS_NANOSLEEP, 35
        .set SYS_GETPID, 39
        .set SYS_KILL, 62
        .set SYS_GETTID, 186
        .set ESRCH, 3
        .set HANDSHAKE_TRIES, 5000      # 1 ms each: a tracer that neither answers nor dies

        .globl THREADS, THREAD_ENTRY, MAX_DEPTH, FRAME_SIZE, FRAMES_OFFSET, TID_OFFSET
        .globl FRAMES_PER_THREAD_SHIFT
        .globl T_TID, T_PID, T_TCB, T_DEPTH, F_STACK, F_ORIG, F_SITE, F_FLAGS
        .globl FRAME_CHAINED, FRAME_EXPOSED
        .globl RING_MASK, RING_RECORDS, RING_HEAD, RING_TAIL, RING_DROPS, RING_OMITTED
        .globl RING_STATE, RING_LOCK, RING_REQ_KIND, RING_REQ_TID, RING_REQ_PID
        .globl RING_REQ_SEQ, RING_ACK_SEQ, RING_DATA, RECORD_SHIFT
        .globl REC_COMMIT, REC_SITE, REC_TID, REC_PID, REC_TSC, REC_CPU, REC_AUX, REC_RDI
        .globl REC_RSI, REC_RDX, REC_RCX, REC_R8, REC_R9, REC_RAX, REC_RSP, REC_STACK0
        .globl REC_STACK1, REC_STACK2, REC_RETURN
        .globl F_ENTRY, F_RETURN, F_EXPOSE, F_CATCH, F_DLOPEN, F_EXEC, HANDSHAKE_TRIES

# ---------------------------------------------------------------------------------------------
# One per patched site. SITE_WORD: site number | flags. The displaced instructions and the jump
# back are appended by the engine after this head.

# frames_of_entry REG: REG := the shadow stack of thread entry %r9 (computed, never stored, so
# an entry is complete the moment its TCB is claimed)
        .macro frames_of_entry reg
        mov     %r9, \reg
        sub     state_ptr(%rip), \reg
        shl     $(FRAMES_PER_THREAD_SHIFT - 5), \reg
        add     state_ptr(%rip), \reg
        add     $FRAMES_OFFSET, \reg
        .endm

        .section .text.site_stub, "ax"
        .globl site_stub
site_stub:
        push    %rsi
        mov     $SITE_WORD, %esi
        call    fentry_common
        pop     %rsi

# ---------------------------------------------------------------------------------------------
# Shared by the sites of one code area. Header fields (ring_ptr, state_ptr, trampoline_ptr,
# rdebug_ptr, tracer_pid, one_ms) live at the start of the area.

        .section .text.common, "ax"
        .globl fentry_common, return_trampoline

        # fentry_common's frame, from %rsp after its pushes
        .set C_R11, 0
        .set C_R10, 8
        .set C_R9, 16
        .set C_R8, 24
        .set C_RDI, 32
        .set C_RDX, 40
        .set C_RCX, 48
        .set C_RAX, 56
        .set C_RSI, 72                  # pushed by the site stub
        .set C_FUNC, 80                 # the function's return address: its %rsp at entry

fentry_common:
        push    %rax
        push    %rcx
        push    %rdx
        push    %rdi
        push    %r8
        push    %r9
        push    %r10
        push    %r11
        mov     %esi, %r8d              # r8d: site word for the whole hit
        call    thread_slot             # r9: thread entry (or 0), rdx: tid | pid << 32
        mov     %rdx, %rsi              # rsi: the ids
        test    $F_HOOKS, %r8d
        jnz     .Lc_hooks

.Lc_entry:
        test    $F_ENTRY, %r8d
        jz      .Lc_return
        mov     ring_ptr(%rip), %rdi
        call    reserve                 # r10: record (or 0), r11d: commit word
        test    %r10, %r10
        jz      .Lc_return
        mov     %r8d, REC_SITE(%r10)
        mov     %rsi, REC_TID(%r10)
        mov     C_RDI(%rsp), %rax
        mov     %rax, REC_RDI(%r10)
        mov     C_RSI(%rsp), %rax
        mov     %rax, REC_RSI(%r10)
        mov     C_RDX(%rsp), %rax
        mov     %rax, REC_RDX(%r10)
        mov     C_RCX(%rsp), %rax
        mov     %rax, REC_RCX(%r10)
        mov     C_R8(%rsp), %rax
        mov     %rax, REC_R8(%r10)
        mov     C_R9(%rsp), %rax
        mov     %rax, REC_R9(%r10)
        mov     C_RAX(%rsp), %rax
        mov     %rax, REC_RAX(%r10)
        lea     C_FUNC(%rsp), %rax
        mov     %rax, REC_RSP(%r10)
        mov     C_FUNC(%rsp), %rax
        mov     %rax, REC_STACK0(%r10)
        mov     C_FUNC+8(%rsp), %rax
        mov     %rax, REC_STACK1(%r10)
        mov     C_FUNC+16(%rsp), %rax
        mov     %rax, REC_STACK2(%r10)
        movq    $0, REC_AUX(%r10)
        rdpid   %rax
        mov     %eax, REC_CPU(%r10)
        rdtsc
        shl     $32, %rdx
        or      %rdx, %rax
        mov     %rax, REC_TSC(%r10)
        mov     %r11d, REC_COMMIT(%r10) # last: x86 keeps the order of stores

.Lc_return:
        test    $F_RETURN, %r8d
        jz      .Lc_done
        test    %r9, %r9
        jz      .Lc_done
        lea     C_FUNC(%rsp), %rdx      # rdx: where the return address lives
        mov     (%rdx), %rax            # rax: the return address
        mov     trampoline_ptr(%rip), %rcx
        mov     T_DEPTH(%r9), %r10d     # r10d: depth
        frames_of_entry %rdi            # rdi: the shadow stack
        cmp     %rcx, %rax
        je      .Lc_chained
.Lc_pop_dead:                           # frames at or below this call were abandoned (longjmp)
        test    %r10d, %r10d
        jz      .Lc_push
        lea     -1(%r10), %r11d
        shl     $5, %r11
        cmp     %rdx, F_STACK(%rdi,%r11)
        ja      .Lc_push                # alive: its slot is above this call's
        dec     %r10d
        jmp     .Lc_pop_dead
.Lc_push:
        cmp     $MAX_DEPTH, %r10d
        jae     .Lc_omitted
        mov     %r10d, %r11d
        shl     $5, %r11
        add     %rdi, %r11
        call    .Lc_fill_frame
        inc     %r10d
        mov     %r10d, T_DEPTH(%r9)     # published
        call    .Lc_fill_frame          # again: a signal handler may have used the slot before
        mov     %rcx, (%rdx)            # the function now returns into the trampoline
        jmp     .Lc_done
.Lc_chained:                            # a tail call: reuse the hooked caller's real return
        test    %r10d, %r10d
        jz      .Lc_store_depth
        lea     -1(%r10), %r11d
        shl     $5, %r11
        cmp     %rdx, F_STACK(%rdi,%r11)
        jae     .Lc_chain_push
        dec     %r10d
        jmp     .Lc_chained
.Lc_chain_push:
        cmp     $MAX_DEPTH, %r10d
        jae     .Lc_omitted
        mov     F_ORIG(%rdi,%r11), %rax
        mov     %r10d, %r11d
        shl     $5, %r11
        add     %rdi, %r11
        call    .Lc_fill_frame
        movl    $FRAME_CHAINED, F_FLAGS(%r11)
        inc     %r10d
        mov     %r10d, T_DEPTH(%r9)
        call    .Lc_fill_frame
        movl    $FRAME_CHAINED, F_FLAGS(%r11)
        jmp     .Lc_done
.Lc_omitted:
        mov     %r10d, T_DEPTH(%r9)
        mov     ring_ptr(%rip), %rdi
        lock incq RING_OMITTED(%rdi)
        jmp     .Lc_done
.Lc_store_depth:
        mov     %r10d, T_DEPTH(%r9)

.Lc_done:
        pop     %r11
        pop     %r10
        pop     %r9
        pop     %r8
        pop     %rdi
        pop     %rdx
        pop     %rcx
        pop     %rax
        ret

.Lc_fill_frame:                         # frame r11 := {rdx, rax, r8d, 0}
        mov     %rdx, F_STACK(%r11)
        mov     %rax, F_ORIG(%r11)
        mov     %r8d, F_SITE(%r11)
        movl    $0, F_FLAGS(%r11)
        ret

.Lc_hooks:
        test    $(F_DLOPEN | F_EXEC), %r8d
        jz      .Lc_unwinder
        call    handshake
        jmp     .Lc_entry
.Lc_unwinder:
        test    %r9, %r9
        jz      .Lc_entry
        lea     C_FUNC(%rsp), %rdx      # rdx: this call's stack slot
        mov     trampoline_ptr(%rip), %rcx
        mov     T_DEPTH(%r9), %r10d
        frames_of_entry %rdi
        test    $F_EXPOSE, %r8d
        jz      .Lc_catch
        xor     %eax, %eax              # expose: put every real return address back
.Lc_expose_next:
        cmp     %r10d, %eax
        jae     .Lc_entry
        mov     %eax, %r11d
        shl     $5, %r11
        add     %rdi, %r11
        testl   $(FRAME_CHAINED | FRAME_EXPOSED), F_FLAGS(%r11)
        jnz     .Lc_expose_skip
        cmp     %rdx, F_STACK(%r11)
        jbe     .Lc_expose_skip         # not above this call: abandoned
        orl     $FRAME_EXPOSED, F_FLAGS(%r11)
        push    %rdx
        mov     F_STACK(%r11), %rdx
        cmp     %rcx, (%rdx)
        jne     .Lc_expose_pop
        push    %rax
        mov     F_ORIG(%r11), %rax
        mov     %rax, (%rdx)
        pop     %rax
.Lc_expose_pop:
        pop     %rdx
.Lc_expose_skip:
        inc     %eax
        jmp     .Lc_expose_next
.Lc_catch:
        test    $F_CATCH, %r8d
        jz      .Lc_entry
.Lc_catch_pop:                          # frames unwound by the exception are gone
        test    %r10d, %r10d
        jz      .Lc_catch_hook
        lea     -1(%r10), %r11d
        shl     $5, %r11
        cmp     %rdx, F_STACK(%rdi,%r11)
        ja      .Lc_catch_hook
        dec     %r10d
        jmp     .Lc_catch_pop
.Lc_catch_hook:
        mov     %r10d, T_DEPTH(%r9)
        xor     %eax, %eax              # survivors get their hook back
.Lc_catch_next:
        cmp     %r10d, %eax
        jae     .Lc_entry
        mov     %eax, %r11d
        shl     $5, %r11
        add     %rdi, %r11
        testl   $FRAME_EXPOSED, F_FLAGS(%r11)
        jz      .Lc_catch_skip
        andl    $~FRAME_EXPOSED, F_FLAGS(%r11)
        testl   $FRAME_CHAINED, F_FLAGS(%r11)
        jnz     .Lc_catch_skip
        push    %rdx
        push    %rax
        mov     F_STACK(%r11), %rdx
        mov     F_ORIG(%r11), %rax
        cmp     %rax, (%rdx)
        jne     .Lc_catch_restore
        mov     %rcx, (%rdx)
.Lc_catch_restore:
        pop     %rax
        pop     %rdx
.Lc_catch_skip:
        inc     %eax
        jmp     .Lc_catch_next

# ---------------------------------------------------------------------------------------------
# thread_slot: the calling thread's entry in the thread table, keyed by its TCB (%fs base),
# claimed on first use. The tid comes from glibc's struct pthread and is checked against
# gettid() whenever it differs from the entry's (first hit, fork child): a mismatch there means
# the field is not glibc's, and the entry then identifies by system calls at every hit.
#   out: %r9 = entry (0: no TLS yet, or the table is full), %rdx = tid | pid << 32
#   clobbers %rax, %rcx, %r10, %r11

thread_slot:
        rdfsbase %r10
        test    %r10, %r10
        jz      .Lts_anonymous          # before the dynamic linker sets up TLS
        mov     %r10, %rcx
        shr     $12, %rcx
        imul    $0x9e3779b1, %ecx, %ecx
        shr     $(32 - THREAD_BITS), %ecx
        mov     $THREADS, %r11d
.Lts_probe:
        mov     %ecx, %r9d
        shl     $5, %r9
        add     state_ptr(%rip), %r9
        cmp     %r10, T_TCB(%r9)
        je      .Lts_found
        cmpq    $0, T_TCB(%r9)
        je      .Lts_claim
.Lts_next:
        inc     %ecx
        and     $(THREADS - 1), %ecx
        dec     %r11d
        jnz     .Lts_probe
        jmp     .Lts_anonymous          # full
.Lts_claim:
        xor     %eax, %eax
        lock cmpxchg %r10, T_TCB(%r9)
        jne     .Lts_next               # another thread took it first
        # entries are never freed: the rest of a claimed entry is still zero (tid 0: identify)
.Lts_found:
        mov     %fs:TID_OFFSET, %eax
        cmp     T_TID(%r9), %eax
        jne     .Lts_identify
        mov     T_TID(%r9), %rdx        # tid | pid << 32
        ret
.Lts_identify:
        mov     $SYS_GETTID, %eax
        syscall
        mov     %eax, %edx
        mov     $SYS_GETPID, %eax
        syscall
        cmp     %fs:TID_OFFSET, %edx
        jne     .Lts_untrusted
        cmp     T_PID(%r9), %eax
        jne     .Lts_keep               # a fork child continues its parent's frames
        movl    $0, T_DEPTH(%r9)        # a new thread in a reused TCB: nothing pending
.Lts_keep:
        mov     %edx, T_TID(%r9)
        mov     %eax, T_PID(%r9)
        shl     $32, %rax
        or      %rax, %rdx
        ret
.Lts_untrusted:
        movl    $0, T_TID(%r9)
        mov     %eax, T_PID(%r9)
        shl     $32, %rax
        or      %rax, %rdx
        ret
.Lts_anonymous:
        xor     %r9d, %r9d
        mov     $SYS_GETTID, %eax
        syscall
        mov     %eax, %edx
        mov     $SYS_GETPID, %eax
        syscall
        shl     $32, %rax
        or      %rax, %rdx
        ret

# ---------------------------------------------------------------------------------------------
# reserve: one record in the ring at %rdi.
#   out: %r10 = record (0: the ring is full, counted), %r11d = its commit word
#   clobbers %rax, %rcx

reserve:
        mov     RING_HEAD(%rdi), %rax
.Lr_try:
        mov     %rax, %rcx
        sub     RING_TAIL(%rdi), %rcx
        cmp     RING_RECORDS(%rdi), %rcx
        jae     .Lr_full
        lea     1(%rax), %rcx
        lock cmpxchg %rcx, RING_HEAD(%rdi)
        jne     .Lr_try
        lea     1(%rax), %r11d
        and     RING_MASK(%rdi), %rax
        shl     $RECORD_SHIFT, %rax
        lea     RING_DATA(%rdi,%rax), %r10
        ret
.Lr_full:
        lock incq RING_DROPS(%rdi)
        xor     %r10d, %r10d
        ret

# ---------------------------------------------------------------------------------------------
# return_trampoline: hooked functions return here. Pops the top chain of the shadow stack
# (the kernel's handle_trampoline: chains whose next frame is no longer alive were abandoned
# and are dropped unreported), records each returning frame, and returns to the real address.

        # the trampoline's frame, from %rsp after its pushes
        .set T_R11, 0
        .set T_R10, 8
        .set T_R9, 16
        .set T_R8, 24
        .set T_RDI, 32
        .set T_RSI, 40
        .set T_RDX, 48
        .set T_RCX, 56
        .set T_RAX, 64
        .set T_RET, 72
        .set T_SP, 80                   # %rsp after the function's ret

return_trampoline:
        lea     -8(%rsp), %rsp          # room for the real return address
        push    %rax
        push    %rcx
        push    %rdx
        push    %rsi
        push    %rdi
        push    %r8
        push    %r9
        push    %r10
        push    %r11
        call    thread_slot
        test    %r9, %r9
        jz      .Lt_lost
        mov     T_DEPTH(%r9), %r10d
        frames_of_entry %rdi
        lea     T_SP(%rsp), %rsi
.Lt_chain:
        test    %r10d, %r10d
        jz      .Lt_lost
        lea     -1(%r10), %ecx          # ecx: the chain's first (lowest) frame
.Lt_chain_start:
        test    %ecx, %ecx
        jz      .Lt_valid
        mov     %ecx, %eax
        shl     $5, %rax
        testl   $FRAME_CHAINED, F_FLAGS(%rdi,%rax)
        jz      .Lt_valid
        dec     %ecx
        jmp     .Lt_chain_start
.Lt_valid:
        mov     $1, %r8d                # r8d: the next frame down is still alive
        test    %ecx, %ecx
        jz      .Lt_report
        lea     -1(%rcx), %eax
        shl     $5, %rax
        cmp     %rsi, F_STACK(%rdi,%rax)
        jae     .Lt_report
        xor     %r8d, %r8d
.Lt_report:
        test    %r8d, %r8d
        jz      .Lt_pop
        mov     %r10d, %eax             # report frames depth-1 down to ecx, innermost first
.Lt_report_next:
        cmp     %ecx, %eax
        jbe     .Lt_pop
        dec     %eax
        push    %rax
        push    %r8
        shl     $5, %rax
        lea     (%rdi,%rax), %r8
        call    emit_return
        pop     %r8
        pop     %rax
        jmp     .Lt_report_next
.Lt_pop:
        mov     %ecx, %eax
        shl     $5, %rax
        mov     F_ORIG(%rdi,%rax), %rax
        mov     %rax, T_RET(%rsp)
        mov     %ecx, %r10d
        test    %r8d, %r8d
        jz      .Lt_chain
        mov     %r10d, T_DEPTH(%r9)
        pop     %r11
        pop     %r10
        pop     %r9
        pop     %r8
        pop     %rdi
        pop     %rsi
        pop     %rdx
        pop     %rcx
        pop     %rax
        ret
.Lt_lost:                               # no frame to return to: fault as the kernel does
        movq    $0, 0
        ud2

# emit_return: the return record of frame %r8, with %rsi = %rsp after the return and
# %rdx = ids; registers at the return read from the trampoline's frame below %rsi.
emit_return:
        push    %rdi
        push    %rcx
        push    %r10
        push    %r11
        mov     ring_ptr(%rip), %rdi
        call    reserve
        test    %r10, %r10
        jz      .Le_done
        mov     F_SITE(%r8), %eax
        or      $REC_RETURN, %eax
        mov     %eax, REC_SITE(%r10)
        mov     %rdx, REC_TID(%r10)
        mov     F_ORIG(%r8), %rax
        mov     %rax, REC_AUX(%r10)
        mov     T_RDI-T_SP(%rsi), %rax
        mov     %rax, REC_RDI(%r10)
        mov     T_RSI-T_SP(%rsi), %rax
        mov     %rax, REC_RSI(%r10)
        mov     T_RDX-T_SP(%rsi), %rax
        mov     %rax, REC_RDX(%r10)
        mov     T_RCX-T_SP(%rsi), %rax
        mov     %rax, REC_RCX(%r10)
        mov     T_R8-T_SP(%rsi), %rax
        mov     %rax, REC_R8(%r10)
        mov     T_R9-T_SP(%rsi), %rax
        mov     %rax, REC_R9(%r10)
        mov     T_RAX-T_SP(%rsi), %rax
        mov     %rax, REC_RAX(%r10)
        mov     %rsi, REC_RSP(%r10)
        mov     (%rsi), %rax
        mov     %rax, REC_STACK0(%r10)
        mov     8(%rsi), %rax
        mov     %rax, REC_STACK1(%r10)
        mov     16(%rsi), %rax
        mov     %rax, REC_STACK2(%r10)
        rdpid   %rax
        mov     %eax, REC_CPU(%r10)
        push    %rdx
        rdtsc
        shl     $32, %rdx
        or      %rdx, %rax
        pop     %rdx
        mov     %rax, REC_TSC(%r10)
        mov     %r11d, REC_COMMIT(%r10)
.Le_done:
        pop     %r11
        pop     %r10
        pop     %rcx
        pop     %rdi
        ret

# ---------------------------------------------------------------------------------------------
# handshake: ask the tracer to act before this thread goes on (F_DLOPEN: the rendezvous at
# RT_CONSISTENT, so new libraries get their probes before their code runs; F_EXEC: an exec is
# about to replace the image). The tracer stops every thread, does its work and acknowledges.
# Bounded: a tracer that died is noticed by kill(tracer, 0) within 8 ms, one that neither
# answers nor dies after HANDSHAKE_TRIES ms; either way the ring is marked unserved and no
# later handshake waits.
#   in: %r8d = site word; clobbers %rax, %rcx, %rdx, %rdi, %r10, %r11

handshake:
        push    %r8
        push    %r9
        push    %rsi
        mov     ring_ptr(%rip), %rdi
        cmpl    $1, RING_STATE(%rdi)
        jne     .Lh_out
        test    $F_DLOPEN, %r8d
        jz      .Lh_ask
        mov     rdebug_ptr(%rip), %rax
        test    %rax, %rax
        jz      .Lh_ask
        cmpl    $0, 24(%rax)            # r_debug.r_state: only RT_CONSISTENT
        jne     .Lh_out
.Lh_ask:
        mov     $SYS_GETTID, %eax
        syscall
        mov     %eax, %r9d              # r9d: tid
        mov     $SYS_GETPID, %eax
        syscall
        mov     %eax, %esi              # esi: pid
        mov     $HANDSHAKE_TRIES, %r10d
.Lh_lock:
        xor     %eax, %eax
        lock cmpxchg %r9d, RING_LOCK(%rdi)
        je      .Lh_locked
        call    .Lh_pause
        jc      .Lh_gone
        cmpl    $1, RING_STATE(%rdi)
        jne     .Lh_out
        dec     %r10d
        jnz     .Lh_lock
        jmp     .Lh_gone
.Lh_locked:
        mov     %r8d, RING_REQ_KIND(%rdi)
        mov     %r9d, RING_REQ_TID(%rdi)
        mov     %esi, RING_REQ_PID(%rdi)
        mov     $1, %eax
        lock xadd %rax, RING_REQ_SEQ(%rdi)
        lea     1(%rax), %r8            # r8: our request's sequence number
        mov     $HANDSHAKE_TRIES, %r10d
.Lh_wait:
        cmp     RING_ACK_SEQ(%rdi), %r8
        jbe     .Lh_done
        call    .Lh_pause
        jc      .Lh_gone
        dec     %r10d
        jnz     .Lh_wait
.Lh_gone:
        movl    $0, RING_STATE(%rdi)
.Lh_done:
        cmp     %r9d, RING_LOCK(%rdi)
        jne     .Lh_out
        movl    $0, RING_LOCK(%rdi)
.Lh_out:
        pop     %rsi
        pop     %r9
        pop     %r8
        ret

# sleep 1 ms; every 8th time check that the tracer lives: carry set when it is gone
.Lh_pause:
        push    %rdi
        push    %rsi
        lea     one_ms(%rip), %rdi
        xor     %esi, %esi
        mov     $SYS_NANOSLEEP, %eax
        syscall
        test    $7, %r10d
        jnz     .Lh_alive
        mov     tracer_pid(%rip), %edi
        test    %edi, %edi
        jz      .Lh_alive               # not visible from the program's pid namespace
        xor     %esi, %esi
        mov     $SYS_KILL, %eax
        syscall
        cmp     $-ESRCH, %eax
        jne     .Lh_alive
        pop     %rsi
        pop     %rdi
        stc
        ret
.Lh_alive:
        pop     %rsi
        pop     %rdi
        clc
        ret

# ---------------------------------------------------------------------------------------------
# read_tsc: run in probescope's own process to relate the TSC to CLOCK_MONOTONIC.

        .section .text.read_tsc, "ax"
        .globl read_tsc
read_tsc:
        rdtsc
        shl     $32, %rdx
        or      %rdx, %rax
        ret
