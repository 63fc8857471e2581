"""Algorithms register themselves on import (`@ALGOS.register`); importing this package imports every module in
it, so a new algorithm is its module, its yaml and its resume test, with no list of names to extend."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
