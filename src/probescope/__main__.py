"""Entry point for `python -m probescope`."""

from probescope.cli.main import main

raise SystemExit(main())
