"""Jinja templates, one per generated file; shipped as package data."""
