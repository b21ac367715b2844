"""Where tuner caches what it builds (the demo model, generated data): ``$TUNER_HOME`` or the user's cache directory."""
from __future__ import annotations

import os
from pathlib import Path


def tuner_home() -> Path:
    configured = os.environ.get("TUNER_HOME")
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("tuner"))
