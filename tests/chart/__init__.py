"""Tests of the Helm chart, the images and the kind path (no cluster, no Docker)."""
