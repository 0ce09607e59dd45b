"""A QEMU guest running Debian's generic 6.1 kernel, for what the host kernel cannot trace."""
