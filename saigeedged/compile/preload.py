"""Imported by the children's fork server only (child.PRELOAD), never by the daemon: it imports child.MODULES, and
an import that runs out of memory ends the server with child.NO_MEMORY, so the daemon can say OUT_OF_MEMORY.

multiprocessing's own preload swallows an ImportError and lets any other exception end the server with exit code 1:
under a tight address-space limit (prlimit --as, LimitAS=) the server died of `MemoryError: std::bad_alloc` while
importing onnxruntime.quantization, and the daemon saw only an EOF from a server gone (INTERNAL, "a bug"). A shared
library that cannot be mapped is an ImportError naming it: swallowed, it left a server without onnxruntime.
"""

import os
import sys
import traceback
from importlib import import_module

from saigeedged.compile.child import MODULES, NO_MEMORY

NOT_MAPPED = ("failed to map segment", "Cannot allocate memory")  # the loader's words for ENOMEM under RLIMIT_AS


def _starved(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or (isinstance(exc, ImportError) and any(t in str(exc) for t in NOT_MAPPED))


for _name in MODULES:
    try:
        import_module(_name)
    except Exception as _exc:  # noqa: BLE001  (what multiprocessing would do with it, but for want of memory)
        if not _starved(_exc):
            if isinstance(_exc, ImportError):
                continue  # as multiprocessing's preload: the child imports it again and reports what fails
            raise
        try:  # the journal says which import it was; printing may fail for want of memory too
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(NO_MEMORY)
