"""mtplab's version (a leaf: the package, the CLI and the manifest read it from here)."""
__version__ = "0.1.0"
