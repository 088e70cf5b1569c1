"""An example study package for treeheap-gates (see study.py)."""
