-- Image fields lost between git and the database: inactive_since (retired images,
-- read back by status and plan), and cache_pinned: the catalog's pin, which every
-- host plan carries so no host evicts a pinned image from its cache.
ALTER TABLE os_images ADD COLUMN inactive_since timestamptz;
ALTER TABLE os_images ADD COLUMN cache_pinned boolean NOT NULL DEFAULT false;
