"""Loading another version of a module from a file, for the A/B scripts that run an earlier kernel beside the tree's."""
import importlib.util
from types import ModuleType


def load_module_file(path: str, module_name: str) -> ModuleType:
    """The module in the file ``path``, executed as ``module_name``: a name inside a package (such as
    "flashattn.kernels.decode_hopper_base") lets its relative imports resolve."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
