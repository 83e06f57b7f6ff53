"""Every cache of the central side, in one place: a generic store on disk and its clients, named for what they keep.

- `cachestore`: one SQLite database and HMAC key per state dir; records by namespace, each its own HMAC domain;
- `cachefiles`: the store's file records read safely (a signed head mapped, the rest checked by digest);
- `blobs`: parsed and typed blobs in memory (the reader takes them through `desired.reading.loading.BlobMemory`);
- `blobpacks`: parsed blobs on disk, in packs (the reader takes them through `desired.reading.packs.PackStore`);
- `checkedtrees`: a commit's cross-file problems, and the Reader a CLI command reads trees with;
- `planresults`: finished offline PR plans, replayed;
- `keptworlds`: a PR plan's base (tree, claims, base side, placement engine), kept for the next plan;
- `lazymap`: the table a kept world loads its files, slot maps and sources through, on first read.

Caches are an optimization that is never trusted: anything doubtful is a
miss and the work is done again. The host agent uses none of them; the
reader and the pure core (`desired`) never import this package.
"""
