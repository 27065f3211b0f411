"""Folders that last as long as the test process: for what must exist before any fixture runs
(environment variables set at import), removed when the process exits, so that runs of the
suite do not pile up in the temporary folder."""
from __future__ import annotations

import atexit
import shutil
import tempfile


def session_folder(prefix: str) -> str:
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
