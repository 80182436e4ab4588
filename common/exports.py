"""Lazy folder facades: `from llmk.attention import flash_attention` imports the kernel module that
defines the name when the name is first asked for, so importing a folder imports no kernel.

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {"flash_attention": "flash_attention_ops"})

(in the folder's __init__.py: each public name -> the module of that folder it lives in)."""

import importlib


def lazy_exports(package, exports):
    """(__getattr__, __dir__, __all__) for `package`, whose public names are `exports`' keys, each
    defined in the submodule its value names. A name is imported once, then kept in the package."""

    def __getattr__(name):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__():
        return sorted(set(vars(importlib.import_module(package))) | set(exports))

    return __getattr__, __dir__, sorted(exports)
