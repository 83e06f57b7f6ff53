"""Reading a desired-state tree: safe file reads, YAML documents, git revisions, the parse pool, typing, deltas.

`gitrepo` reads revisions (GitPython where git's own rules are needed);
`gitobjects` reads refs and objects from the repository's files where that
is exactly what git reads (a PR plan from a kept base starts no git process).

Everything here turns bytes into the values of `desired` (models, problems,
the state). Caches are handed in through the Protocols `desired.reading.loading`
defines; this package keeps none of its own on disk.
"""
