"""Adapters: each module the only owner of one side effect (SQLite, Docker, outbox, journald, webhooks, cache...)."""
