"""The branch engine that runs on the self-hosted runner: pool, seed, branches, runtimes."""

# This folder is installed as pgoverlay.runner (pyproject.toml's package-dir). Imported under its
# folder name, from a checkout, its modules would be loaded a second time as other objects.
if __name__ != "pgoverlay.runner":
    raise ImportError(f"{__name__} is the folder of pgoverlay.runner: import pgoverlay.runner")
