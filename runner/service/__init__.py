"""The engine service: one root process that does the privileged work for the Action and the
listener (its requests and answers, the engine behind it, its HTTP app on a Unix socket, its
client).
"""
