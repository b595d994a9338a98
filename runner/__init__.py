"""The branch engine that runs on the self-hosted runner: pool, seed, branches, runtimes."""
