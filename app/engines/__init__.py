"""Engines: the device work behind the batcher (base.py is their interface)."""
