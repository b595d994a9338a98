"""pgoverlay: copy-on-write Postgres branches for pull requests."""

__version__ = "0.1.0"
