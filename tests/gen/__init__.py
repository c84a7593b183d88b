"""Image generators of the test-suite, one module per kind of image:

- sparse.py: sparse raw files and the bytes written into them (the bottom
  layer: make_sparse, garbage, dig_holes, pad_to_sector, seeded bytes);
- raw_kinds.py: seeded raw images of every layout family (KINDS), by
  (kind, seed);
- raw_layouts.py: named raw layouts built for particular questions;
- convert_sources.py: the convert tests' sources by name (SourceSet);
- qcow2_images.py: the catalogue of qcow2 images made with qemu-img /
  qemu-io, built lazily by a session Store;
- qcow2_meta.py: qcow2 headers and tables read and patched by hand.

Fixtures that make images from these live in tests/conftest.py.
"""
