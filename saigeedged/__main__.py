"""`python -m saigeedged` entry point."""

from saigeedged.cli import main

raise SystemExit(main())
