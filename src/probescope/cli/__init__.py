"""The `probescope` command: thin argument handling over the Python API."""
