"""Intake: inbox drops scanned, settled and claimed into job rows; the daemon's own folders. Every rename in the inbox is here."""
