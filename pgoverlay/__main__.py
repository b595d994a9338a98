from pgoverlay.cli import entry

entry()
