"""The front door: the network-facing process and what it serves (the branch page)."""
