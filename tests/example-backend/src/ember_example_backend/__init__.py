"""ember-example-backend: a minimal third-party ember backend (device kind ``toy``).

The worked example of ``docs/plugin-authors.md``; ember finds it through the entry point ``toy`` in the group
``ember`` (see ``plugin.py``).
"""

__version__ = "0.1.0"
#: backend-contract version this plugin implements
CONTRACT = 1
