"""Datasets: immutable, content-addressed versions of a folder of files (docs/datasets.md).
The pure rules are in manifest.py; where the bytes live, in blobs.py."""
