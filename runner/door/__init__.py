"""The front door: the one network-facing process of a host (the Postgres router and the branch
pages), unprivileged, reaching the root engine only through its socket."""
