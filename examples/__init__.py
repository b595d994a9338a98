"""Example migrations the demo applies."""

# This folder is installed as pgoverlay.examples (pyproject.toml's package-dir). Imported under its
# folder name, from a checkout, its modules would be loaded a second time as other objects.
if __name__ != "pgoverlay.examples":
    raise ImportError(f"{__name__} is the folder of pgoverlay.examples: import pgoverlay.examples")
