"""The PR workflow the composite Action runs: event, branch, migrations, comment."""

# This folder is installed as pgoverlay.action (pyproject.toml's package-dir). Imported under its
# folder name, from a checkout, its modules would be loaded a second time as other objects.
if __name__ != "pgoverlay.action":
    raise ImportError(f"{__name__} is the folder of pgoverlay.action: import pgoverlay.action")
