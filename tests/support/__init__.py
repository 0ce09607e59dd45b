"""Shared test helpers: compiling C targets, tracefs availability, leftover checks."""
