# Type stub of the cffi binding (python/ferry/_binding.py): ffi and lib are
# cffi's objects, declared from include/ferry/*.h when the package is built.
from typing import Any

ffi: Any
lib: Any
