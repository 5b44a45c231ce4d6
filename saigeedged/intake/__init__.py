"""Intake: inbox drops scanned, settled and claimed into job rows; the daemon's own folders."""
