"""Desired state: the typed kinds an operator or the portal bot commits to git.

The core of this package is pure value types and rules: the models
(`desired.models`), the address patterns both agents check (`patterns`), the
problem codes (`problems`) and the state of one revision (`state`). Reading
a tree (files, YAML, git, the parse pool, typing, deltas) is its own
subpackage, `desired.reading`, which reports every problem with file, line,
column and a stable code. Nothing here talks to a database, libvirt or the
host network, or keeps a cache: the caches are `reconciler.caches`.
"""
