"""The web application's routers, one per resource: the branch page and sign-in for the pages
(``page.create_page``), the pool, the branches and their holds for the network API
(``api.create_api``). A route parses its request, calls the engine through a dependency of
``web/deps.py``, and answers; errors are the app's one set of exception handlers'."""
