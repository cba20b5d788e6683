"""The layer above the probe: what opens a watch session for the user.

The framework callbacks (:mod:`gradwatch.lightning`, :mod:`gradwatch.huggingface`, thin
public names for :mod:`.lightning` and :mod:`.huggingface` here), the notebook extension
(``%load_ext gradwatch``), the pytest plugin (``pytest --gradwatch``), the demo, and
:mod:`.sessions`, the one home of the sessions they open. Each imports the probe (and so
torch) when used; the torch-free core (:mod:`gradwatch`) never imports this package.
"""
