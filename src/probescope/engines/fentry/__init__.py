"""The fentry engine: trap-free probes on the function entries and returns of running programs.

The ftrace mechanism applied to a user process (mechanisms.md §10): stop every thread, inject a
shared ring and read+execute code areas, patch each probed function entry into a jump to a
stub that records into the ring, detach. A hit costs ~10 ns and no trap; the engine drains the
ring from Python into the same Events as the other engines. See docs/fentry-engine.md.
"""
