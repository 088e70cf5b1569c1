"""The claims dashboard: `gates dashboard` serves it locally (read-only), `gates report --html DIR`
writes the same pages as static files.

data.py loads (evidence, contract checks from gates.verify, MLflow histories), board.py selects the
board's rows from its query string, conditions.py reads conditions and controls for a reviewer,
diff.py compares two versions of a contract, svg.py draws the charts, render.py writes the HTML,
site.py maps pages to both outputs, server.py serves them.
"""
