"""GitHub, the forge pgoverlay works with: its grammar (``grammar``: logins, ``owner/name``,
repository roles) and the one client of its REST API (``rest``, with ``app`` for a GitHub App's
installation tokens). What the PR workflow asks of GitHub is ``pgoverlay.action.github``'s; the
branch page's sign-in is ``pgoverlay.runner.callers.oauth``'s; both go through ``rest``."""
