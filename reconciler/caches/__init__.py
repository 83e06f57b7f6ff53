"""Every cache of the central side, in one place: a generic store on disk and its clients, named for what they keep.

- `cachestore`: one SQLite database and key per state dir, HMAC-signed records by namespace;
- `blobs`: parsed and typed blobs in memory (the reader takes them through `desired.reading.loading.BlobMemory`);
- `blobpacks`: parsed blobs on disk, in packs;

The host agent uses none of them; the reader and the pure core never import this package.
"""
