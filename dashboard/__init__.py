"""The claims dashboard: `gates dashboard` serves it locally (read-only), `gates report --html DIR`
writes the same pages as static files.

data.py loads (evidence, contract checks from gates.verify, MLflow histories), svg.py draws the
charts, render.py writes the HTML, site.py maps pages to both outputs, server.py serves them.
"""
