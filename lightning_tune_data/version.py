"""The package version, in a leaf module so that any module can read it without importing the package root."""

__version__ = "0.2.0"
