"""The front door's HTTPS application: the branch pages behind GitHub sign-in and the network
API, served by the door's process (its own user, never root) on its HTTPS port, reaching the
engine only through its socket.

Modules: ``page`` (the branch pages), ``sessions`` (a signed-in reader's session), ``render``
(the pages' HTML), ``api`` (the network API: an OIDC token, or an API token the engine checks).
"""
