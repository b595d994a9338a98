"""The optional webhook listener: verify, dedupe, queue, and run the PR workflow."""

# This folder is installed as pgoverlay.webhook (pyproject.toml's package-dir). Imported under its
# folder name, from a checkout, its modules would be loaded a second time as other objects.
if __name__ != "pgoverlay.webhook":
    raise ImportError(f"{__name__} is the folder of pgoverlay.webhook: import pgoverlay.webhook")
