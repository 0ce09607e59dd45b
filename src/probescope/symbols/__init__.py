"""Turns names into places: binaries, ELF symbols, debug info and uprobe file offsets."""
