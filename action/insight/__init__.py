"""Migration insight: what each migration did to the branch's full-size data, measured.

``model`` holds the report's data; the engine's trace (``runner/trace``) supplies the raw
observations, and the modules here turn them into per-migration and per-statement facts,
check lint findings against them and give each migration a verdict.
"""
