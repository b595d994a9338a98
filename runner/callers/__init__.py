"""Who is calling, and what the pool lets them do: read by the engine service (its socket's
admission, its own check of the credentials the door forwards) and by the front door's web
application alike, so it imports neither.

Modules: ``oidc`` (a GitHub Actions OIDC token verified, as an ``Identity``), ``oauth`` (a
reader signed in with GitHub, and what they may do on a repository), ``policy`` (the pool's
policy file: which repositories and workflows may use it, limits, forks).
"""
