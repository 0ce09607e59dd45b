"""The one compiled part of probescope: the report accelerator (src/probescope/traceevent/
_fastformat.c). Optional: without a C compiler the install still works and `probescope report`
prints through its pure-Python path (`probescope.traceevent.accel.accelerated()` says which)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "probescope.traceevent._fastformat",
            sources=["src/probescope/traceevent/_fastformat.c"],
            extra_compile_args=["-O2", "-std=gnu11"],
            optional=True,
        )
    ]
)
