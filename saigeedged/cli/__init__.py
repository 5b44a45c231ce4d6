"""The commands: argument parsing, the client commands, one-shot compile, readiness, examples."""
