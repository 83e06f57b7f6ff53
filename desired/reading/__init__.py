"""Reading a desired-state tree: safe file reads, YAML documents, git revisions, the parse pool, typing, deltas.

Everything here turns bytes into the values of `desired` (models, problems,
the state). Caches are handed in through the Protocols `desired.reading.loading`
defines; this package keeps none of its own on disk.
"""
