"""Tracing a branch while migrations run on it: see ``pgoverlay.runner.service.models.TraceMark``."""
