"""`python -m saigeedged` entry point."""

from saigeedged.cli.main import main

raise SystemExit(main())
