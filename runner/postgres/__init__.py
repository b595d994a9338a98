"""Postgres itself, as the engine uses it: its binaries, one postmaster, a private server for
the engine's own work, and the programs (pg_basebackup, psql, ...) behind one ``Tools`` interface,
and psycopg's errors turned into ours (``sqlerror``).
"""
