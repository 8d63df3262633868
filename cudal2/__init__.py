"""cudal2: ahead-of-time HGEMM kernel generator and packager."""

__version__ = "0.1.0"
