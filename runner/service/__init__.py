"""The engine service: one root process that does the privileged work for the Action and the
listener (models, the engine behind it, its HTTP app on a Unix socket, its client).
"""
