"""Database adapters: how pgsnap talks to a database server (``postgres``: PostgreSQL 12-18)."""
