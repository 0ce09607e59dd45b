"""The kernel's own tracing through tracefs: instances, dynamic events, the ring buffer."""
