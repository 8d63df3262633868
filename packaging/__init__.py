"""Wheel writer, dispatch-table reader and diff (installed as ``cudal2.packaging``).

This folder is named ``packaging`` because the product's layout says so, which is
also the name of the PyPA library that pip, transformers and setuptools import.
Installed, it is only ever ``cudal2.packaging``. But when Python runs with the
repository root on ``sys.path`` (``python -m pytest`` or ``python -c`` from the
root), ``import packaging`` would find this folder first; in that case we load the
real library in our place, so nothing that needs it breaks.
"""

if __name__ == "packaging":
    import importlib.machinery as _machinery
    import importlib.util as _util
    import os as _os
    import sys as _sys

    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    _elsewhere = [p for p in _sys.path if _os.path.abspath(p or _os.getcwd()) != _root]
    _spec = _machinery.PathFinder.find_spec("packaging", _elsewhere)
    if _spec is None or _spec.loader is None:
        raise ImportError(
            "the PyPA 'packaging' library is not installed (this folder is cudal2.packaging)"
        )
    _real = _util.module_from_spec(_spec)
    _sys.modules["packaging"] = _real
    _spec.loader.exec_module(_real)
