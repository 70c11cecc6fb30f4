"""Operator tools shipped in the images (no model code, no torch): `python -m services.tools.<tool>`."""
