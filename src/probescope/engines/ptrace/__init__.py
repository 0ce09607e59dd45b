"""uprobes re-implemented in user space with ptrace, for machines without root or tracefs."""
