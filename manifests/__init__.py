"""Shipped manifests (package data) and the manifest schema documentation."""
