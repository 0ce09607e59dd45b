"""Entry point for `python -m probescope`."""

from probescope.cli import main

raise SystemExit(main())
