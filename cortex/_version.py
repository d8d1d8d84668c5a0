"""The one place cortex's version is written: hatch reads it for the wheel, ``cortex.__version__`` imports it."""

__version__ = "0.2.0"
