"""Consumers of the event stream: kernel-identical text, JSON lines, and later aggregations."""
